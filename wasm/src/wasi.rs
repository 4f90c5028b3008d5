//! The few WASI (preview 1) imports a module may use: stdout and stderr (kept up to 64 KiB a
//! request, logged with the object), an empty environment and argument list, the clock, and
//! exit (which fails the input). There are no preopened directories, so no file can be
//! opened; every other WASI import answers `ENOSYS`, so no socket can be opened either.

use wasmtime::{Caller, FuncType, Linker, Val, ValType};

use combd_shards::app::AppError;

use crate::host::{charge, read, write, Host, Stop};

/// The WASI module name.
pub(crate) const MODULE: &str = "wasi_snapshot_preview1";

/// WASI errno values used here.
const ESUCCESS: i32 = 0;
const EBADF: i32 = 8;
const ENOSYS: i32 = 52;
const ENOTCAPABLE: i32 = 76;

/// The most buffers one `fd_write` takes (POSIX's `IOV_MAX`).
const IOVS_MAX: i32 = 1024;

/// The imports defined here; any other WASI import a module names gets an `ENOSYS` stub.
const DEFINED: &[&str] = &[
    "fd_write",
    "fd_close",
    "fd_fdstat_get",
    "fd_prestat_get",
    "fd_prestat_dir_name",
    "path_open",
    "environ_sizes_get",
    "environ_get",
    "args_sizes_get",
    "args_get",
    "clock_time_get",
    "proc_exit",
];

/// Defines the WASI imports of [`DEFINED`].
pub(crate) fn link(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    link_stdio(linker)?;
    link_no_files(linker)?;
    link_clock_and_exit(linker)
}

/// `fd_write` to stdout and stderr (kept within the call's output, the rest counted and cut),
/// `fd_close` and `fd_fdstat_get` of the three standard descriptors.
fn link_stdio(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(
        MODULE,
        "fd_write",
        |mut c: Caller<'_, Host>,
         fd: i32,
         iovs: i32,
         n: i32,
         written: i32|
         -> wasmtime::Result<i32> {
            if fd != 1 && fd != 2 {
                return Ok(EBADF);
            }
            charge(&mut c)?;
            // Only what is kept is copied; the rest is counted as written, and cut.
            let mut total: u32 = 0;
            for i in 0..n.clamp(0, IOVS_MAX) {
                let iov = read(&mut c, iovs.wrapping_add(i.wrapping_mul(8)), 8)?;
                let ptr = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                let kept = len.clamp(0, c.data().output.room());
                let data = read(&mut c, ptr, kept)?;
                c.data_mut().output.write(&data);
                if kept < len {
                    c.data_mut().output.cut = true;
                }
                total = total.wrapping_add(len as u32);
            }
            write(&mut c, written, 4, &total.to_le_bytes())?;
            Ok(ESUCCESS)
        },
    )?;
    linker.func_wrap(MODULE, "fd_close", |_: Caller<'_, Host>, fd: i32| {
        if (0..=2).contains(&fd) {
            ESUCCESS
        } else {
            EBADF
        }
    })?;
    linker.func_wrap(
        MODULE,
        "fd_fdstat_get",
        |mut c: Caller<'_, Host>, fd: i32, out: i32| -> wasmtime::Result<i32> {
            if !(0..=2).contains(&fd) {
                return Ok(EBADF);
            }
            // A character device (so C's stdio buffers it by line), rights: fd_write only.
            let mut stat = [0u8; 24];
            stat[0] = 2;
            stat[8..16].copy_from_slice(&(1u64 << 6).to_le_bytes());
            write(&mut c, out, 24, &stat)?;
            Ok(ESUCCESS)
        },
    )?;
    Ok(())
}

/// No files, no preopened directories, an empty environment and no arguments.
fn link_no_files(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(
        MODULE,
        "fd_prestat_get",
        |_: Caller<'_, Host>, _: i32, _: i32| EBADF,
    )?;
    linker.func_wrap(
        MODULE,
        "fd_prestat_dir_name",
        |_: Caller<'_, Host>, _: i32, _: i32, _: i32| EBADF,
    )?;
    linker.func_wrap(
        MODULE,
        "path_open",
        |_: Caller<'_, Host>,
         _fd: i32,
         _dirflags: i32,
         _path: i32,
         _path_len: i32,
         _oflags: i32,
         _rights: i64,
         _inheriting: i64,
         _fdflags: i32,
         _out: i32| ENOTCAPABLE,
    )?;
    for (sizes, get) in [
        ("environ_sizes_get", "environ_get"),
        ("args_sizes_get", "args_get"),
    ] {
        linker.func_wrap(
            MODULE,
            sizes,
            |mut c: Caller<'_, Host>, count: i32, size: i32| -> wasmtime::Result<i32> {
                write(&mut c, count, 4, &0u32.to_le_bytes())?;
                write(&mut c, size, 4, &0u32.to_le_bytes())?;
                Ok(ESUCCESS)
            },
        )?;
        linker.func_wrap(MODULE, get, |_: Caller<'_, Host>, _: i32, _: i32| ESUCCESS)?;
    }
    Ok(())
}

/// The wall clock, and `proc_exit`, which fails the input.
fn link_clock_and_exit(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(
        MODULE,
        "clock_time_get",
        |mut c: Caller<'_, Host>, _id: i32, _precision: i64, out: i32| -> wasmtime::Result<i32> {
            let ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            write(&mut c, out, 8, &ns.to_le_bytes())?;
            Ok(ESUCCESS)
        },
    )?;
    linker.func_wrap(
        MODULE,
        "proc_exit",
        |_: Caller<'_, Host>, code: i32| -> wasmtime::Result<()> {
            Err(Stop(AppError::new(
                500,
                format!("the module exited (status {code}) on this input"),
            ))
            .into())
        },
    )?;
    Ok(())
}

/// Adds an `ENOSYS` stub for each WASI import of `module` not in [`DEFINED`] (a function
/// answering one i32); a WASI import of any other shape is refused.
pub(crate) fn stub_the_rest(
    linker: &mut Linker<Host>,
    module: &wasmtime::Module,
) -> Result<(), String> {
    for import in module.imports() {
        if import.module() != MODULE || DEFINED.contains(&import.name()) {
            continue;
        }
        let ty: FuncType = import
            .ty()
            .func()
            .cloned()
            .ok_or_else(|| format!("WASI import {} is not a function", import.name()))?;
        if ty.results().len() != 1 || !matches!(ty.results().next(), Some(ValType::I32)) {
            return Err(format!(
                "WASI import {} is not one this node provides",
                import.name()
            ));
        }
        linker
            .func_new(MODULE, import.name(), ty, |_, _, results| {
                results[0] = Val::I32(ENOSYS);
                Ok(())
            })
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
