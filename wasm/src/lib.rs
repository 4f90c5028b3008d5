//! # combd-wasm
//!
//! Apps deployed as WebAssembly core modules, beside the apps compiled into the node. Each
//! `<app>.wasm` (or `<app>.wat`, the text format) in `COMBD_APPS_DIR` is app `<app>` at
//! `/o/<app>/<name>`, an [`App`] like the native ones: the same objects, mailboxes, batches,
//! sessions, broadcasts, SQLite database per object and durability, because the node's cells
//! run it exactly as they run a native app. What differs is inside a call:
//!
//! - **A fresh instance per call** (or per batch), from code compiled once ([`module`]): the
//!   object's state is its database, so an instance keeps nothing between calls, a trap
//!   leaves nothing behind, and a live object holds no instance while it waits for mail.
//! - **Limits the runtime enforces** on the blocking thread where the call runs (never on the
//!   shard's loop): fuel of `COMBD_CPU_LIMIT_TICKS` (one unit an instruction, each host call
//!   [`HOST_CALL_TICKS`](combd_kernel::limits::HOST_CALL_TICKS)), after which the call traps
//!   with `cpu_limit` however the module loops, every byte a host call copies paid for too
//!   ([`WASM_BYTES_PER_TICK`](combd_kernel::limits::WASM_BYTES_PER_TICK)); a wall-time
//!   deadline beside it ([`WASM_CALL_DEADLINE`](combd_kernel::limits::WASM_CALL_DEADLINE),
//!   wasmtime's epochs), for what fuel does not count (a bulk memory instruction is one tick,
//!   whatever its length), past which the call traps with `cpu_limit` too; the app's
//!   `memory_kb` caps linear memory and
//!   tables (a `ResourceLimiter`), growth past it traps with `memory_limit`; stdout, stderr
//!   and `combd.log` keep 64 KiB a request. A trap fails its input and the transaction around
//!   it is rolled back, like an app's panic.
//! - **The imports** ([`host`]): the input, the answer, SQL with parameters and rows, sends
//!   and broadcasts, the log, and a sliver of WASI ([`wasi`]): stdout/stderr, an empty
//!   environment, the clock, exit. No file, socket or environment variable can be reached.
//! - **Deploying** ([`Deployed`]): modules are checked and compiled at start (a bad one stops
//!   the start naming its file) and again on SIGHUP, when a changed module replaces the old
//!   version (live objects take it after their batch), a new module is deployed, the app of a
//!   module gone is removed from the node's registry, and a module that fails to load is
//!   refused and the old one kept. Compiled code is cached in the data directory ([`cache`]).
//!
//! The ABI is documented in the README ("Apps as WebAssembly modules").

mod cache;
mod host;
mod module;
mod realtime;
mod sql;
mod sql_state;
mod v2;
mod wasi;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use combd_kernel::limits::WASM_EPOCH_TICK;
use combd_shards::app::{
    valid_object_name, App, AppError, Apps, Cx, Deployment, Input, Output, Resync,
};
use wasmtime::{Config, Engine, Linker};

use module::{Loader, Version};

/// A module that cannot be deployed: its file and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployError {
    /// The module's file.
    pub file: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl std::fmt::Display for DeployError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.message)
    }
}

/// A deployed app: the version in force, replaced on a reload that loads.
pub struct WasmApp {
    name: &'static str,
    current: RwLock<Arc<Version>>,
    reloads: AtomicU64,
    reloads_refused: AtomicU64,
}

impl WasmApp {
    fn version(&self) -> Arc<Version> {
        match self.current.read() {
            Ok(v) => v.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, v: Version) {
        let mut w = self.current.write().unwrap_or_else(|p| p.into_inner());
        w.retired.store(true, Ordering::Relaxed);
        *w = Arc::new(v);
    }

    /// Its module was removed: its objects finish what waits for them, then go.
    fn retire(&self) {
        self.version().retired.store(true, Ordering::Relaxed);
    }
}

/// Every call goes to the version in force; an object pins the version it was restored on
/// ([`App::pinned`]), so a reload reaches it when it is next restored.
impl App for WasmApp {
    fn name(&self) -> &'static str {
        self.name
    }
    fn schema(&self) -> &'static str {
        self.version().schema()
    }
    fn memory_kb(&self) -> Option<u64> {
        self.version().memory_kb()
    }
    fn topic(&self, query: Option<&str>) -> Result<String, AppError> {
        self.version().topic(query)
    }
    fn resync(&self) -> Resync {
        self.version().resync()
    }
    fn identified(&self) -> bool {
        self.version().identified()
    }
    fn presence(&self) -> bool {
        self.version().presence()
    }
    fn log_retention(&self) -> combd_shards::app::LogRetention {
        self.version().log_retention()
    }
    fn schema_version(&self) -> u32 {
        self.version().schema_version()
    }
    fn expiry(&self) -> Option<std::time::Duration> {
        self.version().expiry()
    }
    fn migrate(&self, cx: &mut Cx<'_>, from: u32) -> Result<(), AppError> {
        self.version().migrate(cx, from)
    }
    fn wants_header(&self, name: &str) -> bool {
        self.version().wants_header(name)
    }
    fn cors(&self, origin: &str) -> Option<combd_shards::app::Cors> {
        self.version().cors(origin)
    }
    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        self.version().handle(cx, input)
    }
    fn handles_batch(&self) -> bool {
        self.version().handles_batch()
    }
    fn handle_batch(&self, cx: &mut Cx<'_>, inputs: &[Input<'_>]) -> Result<Vec<Output>, AppError> {
        self.version().handle_batch(cx, inputs)
    }
    fn pinned(&self) -> Option<Arc<dyn App>> {
        Some(self.version())
    }
    fn deployment(&self) -> Option<Deployment> {
        let v = self.version();
        Some(Deployment {
            file: v.file.display().to_string(),
            hash: v.hash.clone(),
            loaded_at_unix_ms: v.loaded_at_ms,
            from_cache: v.cached,
            memory_kb: v.memory_kb().unwrap_or(0),
            instance_bytes: v.initial_bytes,
            reloads: self.reloads.load(Ordering::Relaxed),
            reloads_refused: self.reloads_refused.load(Ordering::Relaxed),
        })
    }
}

/// The modules deployed from one directory, and what it takes to load them again.
pub struct Deployed {
    loader: Loader,
    dir: PathBuf,
    /// The apps deployed now (a reload adds and removes them).
    apps: Mutex<Vec<Arc<WasmApp>>>,
}

/// The outcome of a reload, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Apps whose new version took effect.
    pub replaced: Vec<String>,
    /// Apps whose module did not change.
    pub unchanged: Vec<String>,
    /// Modules refused (the old version kept), with why.
    pub refused: Vec<DeployError>,
    /// Modules that appeared, now deployed.
    pub added: Vec<String>,
    /// Modules that disappeared: their apps are removed (no new request reaches them, their
    /// sessions close 1001, their objects finish what waits and go).
    pub removed: Vec<String>,
}

/// The engine every module runs on: fuel, and epochs for the calls' wall-time deadlines (its
/// epoch advanced by [`tick_epochs`]); nothing else beyond wasmtime's defaults.
fn engine() -> Result<Engine, String> {
    let mut config = Config::new();
    config.consume_fuel(true);
    config.epoch_interruption(true);
    let engine =
        Engine::new(&config).map_err(|e| format!("cannot start the WebAssembly engine: {e}"))?;
    tick_epochs(&engine)?;
    Ok(engine)
}

/// Advances `engine`'s epoch every [`WASM_EPOCH_TICK`] on a thread of its own, for as long as
/// the engine lives: the clock every call's deadline is counted on
/// ([`WASM_CALL_DEADLINE`](combd_kernel::limits::WASM_CALL_DEADLINE)).
fn tick_epochs(engine: &Engine) -> Result<(), String> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("combd-wasm-epoch".into())
        .spawn(move || loop {
            // The ticker's period is its job: there is no event to wait for.
            std::thread::sleep(WASM_EPOCH_TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => return,
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the WebAssembly epoch thread: {e}"))
}

/// The module files of `dir`: `(app name, file)`, sorted. A missing directory has none.
fn module_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, DeployError> {
    let err = |file: &Path, message: String| DeployError {
        file: file.to_path_buf(),
        message,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(err(dir, format!("cannot read the apps directory: {e}"))),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| err(dir, e.to_string()))?.path();
        let ext = path.extension().and_then(|e| e.to_str());
        if !matches!(ext, Some("wasm" | "wat")) {
            continue;
        }
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if !valid_object_name(name) {
            return Err(err(&path, format!("{name:?} is not a valid app name")));
        }
        if files.iter().any(|(n, _)| n == name) {
            return Err(err(
                &path,
                format!("app {name:?} has both a .wasm and a .wat"),
            ));
        }
        files.push((name.to_string(), path));
    }
    files.sort();
    Ok(files)
}

impl Deployed {
    /// Loads every module of `dir` (compiled code cached under `<data_dir>/wasm-cache`), each
    /// call with `cpu_limit_ticks` of fuel, each module's memory at most `memory_max_bytes`
    /// (`COMBD_MODULE_MEMORY_MAX`). The first module that fails stops it, named.
    pub fn load(
        dir: &Path,
        data_dir: &Path,
        cpu_limit_ticks: u64,
        memory_max_bytes: u64,
    ) -> Result<Deployed, DeployError> {
        Self::load_with(dir, data_dir, cpu_limit_ticks, memory_max_bytes, true)
    }

    /// Checks every module of `dir` as [`Deployed::load`] would load it, writing nothing (the
    /// cache is read, not written): what `--check-config` runs.
    pub fn check(
        dir: &Path,
        data_dir: &Path,
        cpu_limit_ticks: u64,
        memory_max_bytes: u64,
    ) -> Result<Deployed, DeployError> {
        Self::load_with(dir, data_dir, cpu_limit_ticks, memory_max_bytes, false)
    }

    fn load_with(
        dir: &Path,
        data_dir: &Path,
        cpu_limit_ticks: u64,
        memory_max_bytes: u64,
        write_cache: bool,
    ) -> Result<Deployed, DeployError> {
        let files = module_files(dir)?;
        let fail = |file: &Path, message: String| DeployError {
            file: file.to_path_buf(),
            message,
        };
        let engine = engine().map_err(|m| fail(dir, m))?;
        let mut linker = Linker::new(&engine);
        host::link(&mut linker)
            .and_then(|()| sql::link(&mut linker))
            .and_then(|()| v2::link(&mut linker))
            .and_then(|()| realtime::link(&mut linker))
            .and_then(|()| wasi::link(&mut linker))
            .map_err(|e| fail(dir, e.to_string()))?;
        let loader = Loader {
            engine,
            linker,
            cache_dir: data_dir.join("wasm-cache"),
            write_cache,
            ticks: cpu_limit_ticks,
            memory_max_kb: memory_max_bytes / 1024,
        };
        let mut apps = Vec::new();
        for (name, file) in files {
            apps.push(load_app(&loader, name, &file).map_err(|m| fail(&file, m))?);
        }
        Ok(Deployed {
            loader,
            dir: dir.to_path_buf(),
            apps: Mutex::new(apps),
        })
    }

    fn deployed(&self) -> MutexGuard<'_, Vec<Arc<WasmApp>>> {
        self.apps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The deployed apps, to register beside the native ones.
    pub fn apps(&self) -> Vec<Arc<dyn App>> {
        self.deployed()
            .iter()
            .map(|a| a.clone() as Arc<dyn App>)
            .collect()
    }

    /// Loads and registers the app of a file that was not deployed: into `deployed`, or its
    /// refusal into `report`.
    fn add_new(
        &self,
        registry: &Apps,
        (name, file): (&String, &PathBuf),
        deployed: &mut Vec<Arc<WasmApp>>,
        report: &mut ReloadReport,
    ) {
        // `Apps::add` counts the app it refuses (a built-in app's name).
        let added = match load_app(&self.loader, name.clone(), file) {
            Ok(_) if registry.contains(name) => {
                registry.add_refused();
                Err(format!("{name:?} is a built-in app's name"))
            }
            Ok(app) => registry
                .add(app.clone())
                .map(|()| app)
                .map_err(|e| e.to_string()),
            Err(message) => {
                registry.add_refused();
                Err(message)
            }
        };
        match added {
            Ok(app) => {
                deployed.push(app);
                report.added.push(name.clone());
            }
            Err(message) => report.refused.push(DeployError {
                file: file.clone(),
                message,
            }),
        }
    }

    /// Loads the directory again, changing `registry` (the node's apps) to match it: each
    /// deployed app whose module changed gets its new version (objects restored from now on
    /// run it; live ones after their current batch), a new module is deployed, and the app of
    /// a module gone is removed. A module that fails to load is refused and counted (for one
    /// deployed, its old version kept).
    pub fn reload(&self, registry: &Apps) -> ReloadReport {
        let mut report = ReloadReport::default();
        let mut deployed = self.deployed();
        let files = match module_files(&self.dir) {
            Ok(f) => f,
            Err(e) => {
                for a in deployed.iter() {
                    a.reloads_refused.fetch_add(1, Ordering::Relaxed);
                }
                report.refused.push(e);
                return report;
            }
        };
        deployed.retain(|app| {
            let kept = files.iter().any(|(n, _)| n == app.name);
            if !kept {
                registry.remove(app.name);
                app.retire();
                report.removed.push(app.name.to_string());
            }
            kept
        });
        for (name, file) in &files {
            if !deployed.iter().any(|a| a.name == name) {
                self.add_new(registry, (name, file), &mut deployed, &mut report);
            }
        }
        for app in deployed.iter() {
            let Some((_, file)) = files.iter().find(|(n, _)| n == app.name) else {
                continue;
            };
            let unchanged = cache::read_module(file)
                .map(|b| cache::sha256_hex(&b) == app.version().hash)
                .unwrap_or(false);
            if unchanged {
                report.unchanged.push(app.name.to_string());
                continue;
            }
            match self.loader.load(app.name, file) {
                Ok(v) => {
                    app.replace(v);
                    app.reloads.fetch_add(1, Ordering::Relaxed);
                    report.replaced.push(app.name.to_string());
                }
                Err(message) => {
                    app.reloads_refused.fetch_add(1, Ordering::Relaxed);
                    report.refused.push(DeployError {
                        file: file.clone(),
                        message,
                    });
                }
            }
        }
        report
    }
}

/// Loads the module of app `name` from `file`, as a new app (its name kept for the node's
/// life: each app added while it runs leaks its few bytes, once).
fn load_app(loader: &Loader, name: String, file: &Path) -> Result<Arc<WasmApp>, String> {
    let name: &'static str = Box::leak(name.into_boxed_str());
    let v = loader.load(name, file)?;
    Ok(Arc::new(WasmApp {
        name,
        current: RwLock::new(Arc::new(v)),
        reloads: AtomicU64::new(0),
        reloads_refused: AtomicU64::new(0),
    }))
}
