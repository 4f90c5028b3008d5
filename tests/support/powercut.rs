//! A SQLite VFS that knows what a power cut would lose: it wraps the `unix` VFS, and for every
//! file keeps the pre-image of each write and truncation not yet covered by a completed sync.
//! [`cut`] takes the durable image of every file at one instant (the file's current bytes with
//! every unsynced change undone, newest first) while the node goes on writing: that image is
//! what a disk that dropped everything not synced would hold after the cut.
//!
//! A sync covers the changes that completed before it began: when an `xSync` (or the node's own
//! WAL sync, seen through `combd_shards::testing::WAL_SYNC_OBSERVER`) starts, the
//! file's undo log length is noted; when it returns, that many oldest entries are dropped.
//! Writes, truncations and the images take one lock, so an image never sees half a change.
//! Not modelled: directory entries (a file created and never synced is imaged empty, not
//! absent), torn sectors, and a disk that keeps some unsynced writes (this one keeps none).

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, Once};

use rusqlite::ffi;

/// One unsynced change: the bytes it overwrote and the file's size before it.
struct Undo {
    offset: usize,
    old: Vec<u8>,
    size_before: usize,
}

/// Unsynced changes by file path (a sync through any handle of a path covers them all).
static UNDO: Mutex<Option<HashMap<PathBuf, Vec<Undo>>>> = Mutex::new(None);
static REGISTER: Once = Once::new();
/// While set, a sync of a file under this directory waits (a disk that has not answered yet).
static HOLD: (Mutex<Option<PathBuf>>, Condvar) = (Mutex::new(None), Condvar::new());

/// While set, a sync of a file under this directory fails (`SQLITE_IOERR_FSYNC`), and covers
/// nothing.
static FAIL: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Makes every sync of a file under `dir` fail (None: they succeed again).
pub fn fail_syncs(dir: Option<&Path>) {
    *FAIL.lock().unwrap() = dir.map(Path::to_path_buf);
}

/// Holds every sync of a file under `dir` until [`release_syncs`].
pub fn hold_syncs(dir: &Path) {
    *HOLD.0.lock().unwrap() = Some(dir.to_path_buf());
}

/// Lets the held syncs return.
pub fn release_syncs() {
    *HOLD.0.lock().unwrap() = None;
    HOLD.1.notify_all();
}

fn wait_if_held(path: &Path) {
    let mut held = HOLD.0.lock().unwrap();
    while held.as_ref().is_some_and(|d| path.starts_with(d)) {
        held = HOLD.1.wait(held).unwrap();
    }
}

/// Our file: the SQLite header, the real file after it, and its path (if it has one).
#[repr(C)]
struct ShimFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    path: *mut PathBuf,
}

static mut REAL: *mut ffi::sqlite3_vfs = std::ptr::null_mut();

fn real_vfs() -> *mut ffi::sqlite3_vfs {
    // SAFETY: written once inside REGISTER before any file is opened through the shim.
    unsafe { REAL }
}

/// Registers the VFS as the process's default (once). Every connection opened afterwards
/// without a named VFS goes through it.
pub fn register() {
    REGISTER.call_once(|| {
        *UNDO.lock().unwrap() = Some(HashMap::new());
        let observer: combd_shards::testing::WalSyncObserver = node_wal_sync;
        assert!(combd_shards::testing::WAL_SYNC_OBSERVER
            .set(observer)
            .is_ok());
        // SAFETY: the unix VFS is built in; the copy lives for the whole process (leaked).
        unsafe {
            let real = ffi::sqlite3_vfs_find(c"unix".as_ptr());
            assert!(!real.is_null(), "the unix VFS");
            REAL = real;
            let mut v = *real;
            v.zName = c"powercut".as_ptr();
            v.pNext = std::ptr::null_mut();
            v.szOsFile = (std::mem::size_of::<ShimFile>() as c_int) + (*real).szOsFile;
            v.xOpen = Some(x_open);
            v.xDelete = Some(x_delete);
            let v = Box::leak(Box::new(v));
            assert_eq!(ffi::sqlite3_vfs_register(v, 1), ffi::SQLITE_OK);
        }
    });
}

/// The durable image of each file in `dirs` whose name ends with one of `suffixes`, at this
/// instant, and `at_cut()` read while no change can land (so it is ordered before the image).
pub fn cut<T>(
    dirs: &[&Path],
    suffixes: &[&str],
    at_cut: impl FnOnce() -> T,
) -> (T, Vec<(PathBuf, Vec<u8>)>) {
    let guard = UNDO.lock().unwrap();
    let seen = at_cut();
    let undo = guard.as_ref().unwrap();
    let mut images = Vec::new();
    let entries = dirs
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten());
    for entry in entries {
        let path = entry.path();
        let name = path.to_string_lossy().into_owned();
        if !suffixes.iter().any(|s| name.ends_with(s)) {
            continue;
        }
        let Ok(mut bytes) = std::fs::read(&path) else {
            continue;
        };
        for u in undo
            .get(&path)
            .map(|v| v.as_slice())
            .unwrap_or(&[])
            .iter()
            .rev()
        {
            if bytes.len() < u.offset + u.old.len() {
                bytes.resize(u.offset + u.old.len(), 0);
            }
            bytes[u.offset..u.offset + u.old.len()].copy_from_slice(&u.old);
            bytes.resize(u.size_before, 0);
        }
        images.push((path, bytes));
    }
    drop(guard);
    (seen, images)
}

unsafe fn shim<'a>(f: *mut ffi::sqlite3_file) -> &'a ShimFile {
    // SAFETY: every file with SHIM_METHODS was made by x_open as a ShimFile.
    unsafe { &*(f as *mut ShimFile) }
}

unsafe fn methods(real: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: a real file that opened has its methods for as long as it is open.
    unsafe { &*(*real).pMethods }
}

/// The real file's size.
unsafe fn size_of_real(real: *mut ffi::sqlite3_file) -> usize {
    let mut size: ffi::sqlite3_int64 = 0;
    // SAFETY: an open real file.
    unsafe { methods(real).xFileSize.unwrap()(real, &mut size) };
    size.max(0) as usize
}

/// Reads what `[offset, offset + len)` holds now (within the file's size).
unsafe fn pre_image(real: *mut ffi::sqlite3_file, offset: usize, len: usize) -> Undo {
    // SAFETY: an open real file; the buffer is as long as the read.
    unsafe {
        let size_before = size_of_real(real);
        let end = (offset + len).min(size_before);
        let mut old = vec![0u8; end.saturating_sub(offset)];
        if !old.is_empty() {
            methods(real).xRead.unwrap()(
                real,
                old.as_mut_ptr().cast(),
                old.len() as c_int,
                offset as i64,
            );
        }
        Undo {
            offset,
            old,
            size_before,
        }
    }
}

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite gives szOsFile bytes at `file`: our header, then the real file.
    unsafe {
        let me = file as *mut ShimFile;
        let real = (file as *mut u8).add(std::mem::size_of::<ShimFile>()) as *mut ffi::sqlite3_file;
        (*me).real = real;
        (*me).path = std::ptr::null_mut();
        (*me).base.pMethods = std::ptr::null();
        let vfs = real_vfs();
        let rc = (*vfs).xOpen.unwrap()(vfs, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK || (*real).pMethods.is_null() {
            return rc;
        }
        if !name.is_null() {
            let p = PathBuf::from(CStr::from_ptr(name).to_string_lossy().into_owned());
            (*me).path = Box::into_raw(Box::new(p));
        }
        (*me).base.pMethods = &SHIM_METHODS;
        rc
    }
}

unsafe extern "C" fn x_delete(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    // SAFETY: SQLite passes a NUL-terminated name; the call goes to the real VFS with SQLite's
    // own arguments.
    unsafe {
        let path = PathBuf::from(CStr::from_ptr(name).to_string_lossy().into_owned());
        let mut g = UNDO.lock().unwrap();
        g.as_mut().unwrap().remove(&path);
        let vfs = real_vfs();
        (*vfs).xDelete.unwrap()(vfs, name, sync_dir)
    }
}

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: an open shim file; its path box is ours.
    unsafe {
        let me = shim(f);
        let rc = methods(me.real).xClose.unwrap()(me.real);
        if !me.path.is_null() {
            drop(Box::from_raw(me.path));
        }
        rc
    }
}

unsafe extern "C" fn x_read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    off: i64,
) -> c_int {
    // SAFETY: SQLite calls this only on a file `x_open` made, whose real file opened; `buf`
    // and `amt` are SQLite's, valid for the real file's method as they are for ours.
    unsafe {
        let me = shim(f);
        methods(me.real).xRead.unwrap()(me.real, buf, amt, off)
    }
}

unsafe extern "C" fn x_write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: i64,
) -> c_int {
    // SAFETY: forwarded, under the lock so an image never sees half a write.
    unsafe {
        let me = shim(f);
        let mut g = UNDO.lock().unwrap();
        if !me.path.is_null() {
            let undo = pre_image(me.real, off as usize, amt as usize);
            g.as_mut()
                .unwrap()
                .entry((*me.path).clone())
                .or_default()
                .push(undo);
        }
        let rc = methods(me.real).xWrite.unwrap()(me.real, buf, amt, off);
        drop(g);
        rc
    }
}

unsafe extern "C" fn x_truncate(f: *mut ffi::sqlite3_file, size: i64) -> c_int {
    // SAFETY: forwarded, under the lock.
    unsafe {
        let me = shim(f);
        let mut g = UNDO.lock().unwrap();
        if !me.path.is_null() {
            let now = size_of_real(me.real);
            let from = (size.max(0) as usize).min(now);
            let undo = pre_image(me.real, from, now - from);
            g.as_mut()
                .unwrap()
                .entry((*me.path).clone())
                .or_default()
                .push(undo);
        }
        let rc = methods(me.real).xTruncate.unwrap()(me.real, size);
        drop(g);
        rc
    }
}

/// A sync of the file at `path`, run by `sync` (true when it succeeded): held or failed as
/// the test asks, and once it succeeded the changes that existed when it began are covered.
fn sync_covering(path: &Path, sync: impl FnOnce() -> bool) -> bool {
    wait_if_held(path);
    let failing = FAIL.lock().unwrap().clone();
    if failing.is_some_and(|d| path.starts_with(d)) {
        return false;
    }
    let covered = UNDO
        .lock()
        .unwrap()
        .as_ref()
        .unwrap()
        .get(path)
        .map_or(0, Vec::len);
    let ok = sync();
    if ok && covered > 0 {
        let mut g = UNDO.lock().unwrap();
        if let Some(v) = g.as_mut().unwrap().get_mut(path) {
            v.drain(..covered.min(v.len()));
        }
    }
    ok
}

/// The node's own WAL syncs (on its descriptor), seen like SQLite's.
fn node_wal_sync(path: &Path, sync: &dyn Fn() -> std::io::Result<()>) -> std::io::Result<()> {
    let mut result = Ok(());
    let ok = sync_covering(path, || {
        result = sync();
        result.is_ok()
    });
    if ok {
        Ok(())
    } else {
        result.and(Err(std::io::Error::other(
            "the simulated disk failed the sync",
        )))
    }
}

unsafe extern "C" fn x_sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: forwarded to the real file, which is open while SQLite holds ours.
    unsafe {
        let me = shim(f);
        let sync = || methods(me.real).xSync.unwrap()(me.real, flags);
        if me.path.is_null() {
            return sync();
        }
        let mut rc = ffi::SQLITE_IOERR_FSYNC;
        sync_covering(&*me.path, || {
            rc = sync();
            rc == ffi::SQLITE_OK
        });
        rc
    }
}

macro_rules! forward {
    ($name:ident, $field:ident, ($($a:ident: $t:ty),*), $ret:ty) => {
        unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file $(, $a: $t)*) -> $ret {
            // SAFETY: SQLite calls this only on a file `x_open` made, whose real file opened;
            // the arguments are SQLite's, valid for the real file's method as for ours.
            unsafe {
                let me = shim(f);
                methods(me.real).$field.unwrap()(me.real $(, $a)*)
            }
        }
    };
}

forward!(x_file_size, xFileSize, (p: *mut i64), c_int);
forward!(x_lock, xLock, (l: c_int), c_int);
forward!(x_unlock, xUnlock, (l: c_int), c_int);
forward!(x_check_reserved, xCheckReservedLock, (p: *mut c_int), c_int);
forward!(x_file_control, xFileControl, (op: c_int, p: *mut c_void), c_int);
forward!(x_sector_size, xSectorSize, (), c_int);
forward!(x_device, xDeviceCharacteristics, (), c_int);
forward!(x_shm_map, xShmMap, (pg: c_int, sz: c_int, ext: c_int, pp: *mut *mut c_void), c_int);
forward!(x_shm_lock, xShmLock, (o: c_int, n: c_int, fl: c_int), c_int);
forward!(x_shm_unmap, xShmUnmap, (del: c_int), c_int);

unsafe extern "C" fn x_shm_barrier(f: *mut ffi::sqlite3_file) {
    // SAFETY: SQLite calls this only on a file `x_open` made, whose real file opened.
    unsafe {
        let me = shim(f);
        methods(me.real).xShmBarrier.unwrap()(me.real)
    }
}

static SHIM_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};
