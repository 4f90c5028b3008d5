//! Reading a module file and compiling it, through the compiled-code cache in the data
//! directory: `<data>/wasm-cache/<module sha-256>-<engine hash>.cwasm`, so a restart does not
//! compile again. The engine hash covers wasmtime's version and the engine's settings: a
//! cache entry from another build or configuration is simply not found.

use std::hash::{Hash, Hasher};
use std::path::Path;

use combd_kernel::limits::WASM_MODULE_MAX_BYTES;
use wasmtime::{Engine, Module};

/// Reads a module file: opened once, it must be a regular file (a symbolic link is followed
/// to one; a device, FIFO or directory is refused), and at most [`WASM_MODULE_MAX_BYTES`] are
/// read from that one descriptor, so a file that grows, or is swapped, after its size was
/// looked at cannot make the node read more (a link to `/dev/zero` would read for ever).
pub(crate) fn read_module(file: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = std::fs::File::open(file).map_err(|e| format!("cannot read it: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".to_string());
    }
    let mut bytes = Vec::new();
    f.take(WASM_MODULE_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > WASM_MODULE_MAX_BYTES {
        return Err(format!(
            "past the {WASM_MODULE_MAX_BYTES}-byte limit of a module"
        ));
    }
    Ok(bytes)
}

/// SHA-256 of `bytes`, in hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the engine's compiled code depends on (wasmtime's version, the engine's settings).
fn engine_hash(engine: &Engine) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// The module compiled: from the cache if an entry for this module and engine is there (and
/// loads), else compiled now and written to the cache (unless `write` is false: a dry check).
/// Returns whether it came from the cache.
pub(crate) fn compile(
    engine: &Engine,
    cache_dir: &Path,
    write: bool,
    bytes: &[u8],
    hash: &str,
) -> Result<(Module, bool), String> {
    let entry = cache_dir.join(format!("{hash}-{}.cwasm", engine_hash(engine)));
    if entry.exists() {
        // SAFETY: the cache lives in the node's own data directory, written only by
        // `compile` below (whole files, renamed into place) for this module hash and engine
        // hash; wasmtime checks the entry's header against the engine before using it.
        match unsafe { Module::deserialize_file(engine, &entry) } {
            Ok(m) => return Ok((m, true)),
            Err(e) => {
                tracing::warn!(entry = %entry.display(), "compiled-module cache entry not used: {e}")
            }
        }
    }
    let module = Module::new(engine, bytes).map_err(|e| {
        // One line: the text format's errors point at the source over several.
        let e = format!("{e:#}");
        format!(
            "is not a valid module: {}",
            e.split_whitespace().collect::<Vec<_>>().join(" ")
        )
    })?;
    if !write {
        return Ok((module, false));
    }
    if let Err(e) = store(&module, cache_dir, &entry) {
        tracing::warn!(entry = %entry.display(), "cannot write the compiled-module cache: {e}");
    }
    Ok((module, false))
}

fn store(module: &Module, dir: &Path, entry: &Path) -> Result<(), String> {
    let code = module.serialize().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let tmp = entry.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, code)
        .and_then(|()| std::fs::rename(&tmp, entry))
        .map_err(|e| e.to_string())
}
