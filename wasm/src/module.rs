//! One version of a deployed module: compiled (or taken from the cache), checked against the
//! ABI, and run as an [`App`]: a fresh instance per call (or batch), under fuel, the memory
//! limiter and the output cap.

use std::path::{Path, PathBuf};

use std::time::Duration;

use combd_kernel::limits::{
    APP_CORS_ORIGINS_MAX, APP_HEADERS_MAX, CORS_MAX_AGE_SECONDS, WASM_CALL_DEADLINE,
    WASM_EPOCH_TICK, WASM_LOAD_TICKS, WASM_MEMORY_KB_DEFAULT, WASM_TEXT_MAX_BYTES,
    WASM_TOPIC_DEADLINE, WASM_TOPIC_TICKS,
};
use combd_shards::app::{
    limit_error, withheld_header, App, AppError, Cors, Cx, Input, LogRetention, Output, Resync,
};
use combd_shards::http::Response;
use combd_shards::limit::Limit;
use wasmtime::{Engine, Instance, InstancePre, Linker, Module, Store, Trap, ValType};

use crate::host::{Answer, CallInput, Host, Stop};
use crate::{cache, wasi};

/// A module's version in force: what it is, where it came from, and its compiled code.
pub struct Version {
    pub(crate) name: &'static str,
    pub(crate) file: PathBuf,
    /// The module file's SHA-256, hex.
    pub(crate) hash: String,
    /// When this version was loaded, in milliseconds since the Unix epoch.
    pub(crate) loaded_at_ms: u64,
    /// Whether the compiled code came from the cache.
    pub(crate) cached: bool,
    pre: InstancePre<Host>,
    schema: &'static str,
    memory_kb: u64,
    resync: Resync,
    /// The module serves identified clients only (its `identified()` answered 1).
    identified: bool,
    /// The node keeps its topics' presence (its `presence()` answered 1).
    presence: bool,
    /// How much of its topics' logs its objects keep (its `log_retention()`; the node's).
    retention: LogRetention,
    /// The version its objects are brought to as they open (its `version()`; 1).
    schema_version: u32,
    /// How long its objects may go unwritten (its `expiry()`, in seconds; none).
    expiry: Option<Duration>,
    /// The request header fields it sees (its `headers()`), lower case.
    headers: Vec<String>,
    /// The origins whose pages may call it (its `cors()`); `None`: no CORS.
    cors: Option<Origins>,
    /// What a fresh instance holds: its linear memory's initial size, in bytes.
    pub(crate) initial_bytes: u64,
    /// A reload replaced this version.
    pub(crate) retired: std::sync::atomic::AtomicBool,
    batch: bool,
    topic: bool,
    init: bool,
    /// `COMBD_CPU_LIMIT_TICKS`: the fuel of one call.
    ticks: u64,
}

/// How modules are loaded: the engine, the imports, the cache, the call's fuel.
pub(crate) struct Loader {
    pub engine: Engine,
    pub linker: Linker<Host>,
    pub cache_dir: PathBuf,
    /// Whether compiled code is written to the cache (not by `--check-config`, which creates
    /// nothing).
    pub write_cache: bool,
    pub ticks: u64,
    /// `COMBD_MODULE_MEMORY_MAX` in KiB: the most `memory_kb()` may answer.
    pub memory_max_kb: u64,
}

/// The exports the ABI knows, with their types: (name, params, results, required).
const EXPORTS: &[(&str, &[ValType], &[ValType], bool)] = &[
    ("handle", &[], &[ValType::I32], true),
    ("handle_batch", &[ValType::I32], &[ValType::I32], false),
    ("topic", &[], &[ValType::I32], false),
    ("schema", &[], &[ValType::I32], false),
    ("memory_kb", &[], &[ValType::I32], false),
    ("resync", &[], &[ValType::I32], false),
    ("identified", &[], &[ValType::I32], false),
    ("presence", &[], &[ValType::I32], false),
    ("log_retention", &[], &[ValType::I32], false),
    ("version", &[], &[ValType::I32], false),
    ("expiry", &[], &[ValType::I32], false),
    ("migrate", &[ValType::I32], &[ValType::I32], false),
    ("headers", &[], &[ValType::I32], false),
    ("cors", &[], &[ValType::I32], false),
    ("_initialize", &[], &[], false),
];

/// Checks a module's imports and exports against the ABI.
fn check_abi(module: &Module) -> Result<(), String> {
    for i in module.imports() {
        if i.module() != "combd" && i.module() != wasi::MODULE {
            return Err(format!(
                "imports {}.{}: a module may import only from \"combd\" and \"{}\"",
                i.module(),
                i.name(),
                wasi::MODULE
            ));
        }
    }
    if !matches!(
        module.get_export("memory"),
        Some(wasmtime::ExternType::Memory(_))
    ) {
        return Err("exports no memory named \"memory\"".into());
    }
    for (name, params, results, required) in EXPORTS {
        match module.get_export(name) {
            None if *required => return Err(format!("exports no function {name:?}")),
            None => {}
            Some(wasmtime::ExternType::Func(f)) => {
                let same = |a: &mut dyn Iterator<Item = ValType>, b: &[ValType]| {
                    let a: Vec<ValType> = a.collect();
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| ValType::eq(x, y))
                };
                if !same(&mut f.params(), params) || !same(&mut f.results(), results) {
                    return Err(format!(
                        "export {name:?} has the wrong type (see the ABI in the README)"
                    ));
                }
            }
            Some(_) => return Err(format!("export {name:?} is not a function")),
        }
    }
    Ok(())
}

impl Loader {
    /// Loads `<app>.wasm` or `<app>.wat`: compiled, or taken from the cache; checked against
    /// the ABI; its schema and `memory_kb` read once.
    pub fn load(&self, name: &'static str, file: &Path) -> Result<Version, String> {
        let bytes = cache::read_module(file)?;
        let hash = cache::sha256_hex(&bytes);
        let (module, cached) = cache::compile(
            &self.engine,
            &self.cache_dir,
            self.write_cache,
            &bytes,
            &hash,
        )?;
        check_abi(&module)?;
        let mut linker = self.linker.clone();
        wasi::stub_the_rest(&mut linker, &module)?;
        let pre = linker
            .instantiate_pre(&module)
            .map_err(|e| format!("cannot be linked: {e:#}"))?;
        let has = |n: &str| module.get_export(n).is_some();
        let mut v = Version {
            name,
            file: file.to_path_buf(),
            hash,
            loaded_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            cached,
            batch: has("handle_batch"),
            topic: has("topic"),
            init: has("_initialize"),
            schema: "",
            memory_kb: WASM_MEMORY_KB_DEFAULT.min(self.memory_max_kb),
            resync: Resync::Close,
            identified: false,
            presence: false,
            retention: LogRetention::NODE,
            schema_version: 1,
            expiry: None,
            headers: Vec::new(),
            cors: None,
            initial_bytes: match module.get_export("memory") {
                Some(wasmtime::ExternType::Memory(m)) => m.minimum().saturating_mul(65536),
                _ => 0,
            },
            retired: std::sync::atomic::AtomicBool::new(false),
            pre,
            ticks: self.ticks,
        };
        v.ask_at_load(&module, self.memory_max_kb)?;
        Ok(v)
    }
}

impl Version {
    /// Asks the module what it declares, each export it has called once: its memory
    /// (`memory_kb`, at most `memory_max_kb`), its resync, whether it is identified, its
    /// schema, the header fields it reads and its CORS origins.
    fn ask_at_load(&mut self, module: &wasmtime::Module, memory_max_kb: u64) -> Result<(), String> {
        let has = |n: &str| module.get_export(n).is_some();
        if has("memory_kb") {
            let kb = self.call_at_load("memory_kb")?;
            if kb <= 0 {
                return Err(format!("memory_kb() answered {kb}; it must be at least 1"));
            }
            if kb as u64 > memory_max_kb {
                return Err(format!(
                    "memory_kb() answered {kb} KiB, past COMBD_MODULE_MEMORY_MAX ({} KiB)",
                    memory_max_kb
                ));
            }
            self.memory_kb = kb as u64;
        }
        if has("resync") && self.call_at_load("resync")? == 1 {
            self.resync = Resync::Attach;
        }
        if has("identified") {
            self.identified = match self.call_at_load("identified")? {
                0 => false,
                1 => true,
                n => return Err(format!("identified() answered {n}; it must be 0 or 1")),
            };
        }
        if has("presence") {
            self.presence = match self.call_at_load("presence")? {
                0 => false,
                1 => true,
                n => return Err(format!("presence() answered {n}; it must be 0 or 1")),
            };
        }
        if has("log_retention") {
            self.retention = retention(&self.string_at_load("log_retention")?)?;
        }
        if has("expiry") {
            self.expiry = match self.call_at_load("expiry")? {
                0 => None,
                s if s > 0 => Some(Duration::from_secs(s as u64)),
                s => return Err(format!("expiry() answered {s}; seconds, or 0 for none")),
            };
        }
        if has("version") {
            self.schema_version = match self.call_at_load("version")? {
                v if v >= 1 => v as u32,
                v => return Err(format!("version() answered {v}; it must be at least 1")),
            };
            if self.schema_version > 1 && !has("migrate") {
                return Err(format!(
                    "version() answered {}, but the module exports no migrate(from) to bring \
                     its objects there",
                    self.schema_version
                ));
            }
        }
        if has("schema") {
            // Leaked once per version loaded (at start and at each reload that changes it).
            self.schema = Box::leak(self.string_at_load("schema")?.into_boxed_str());
        }
        if has("headers") {
            self.headers = header_names(&self.string_at_load("headers")?)?;
        }
        if has("cors") {
            self.cors = Some(origins(&self.string_at_load("cors")?)?);
        }
        Ok(())
    }

    /// A store for one call: `fuel` ticks, and `deadline` of wall time (in whole epoch
    /// ticks, counted from now), past either of which the call traps.
    fn store(&self, inputs: Vec<CallInput>, fuel: u64, deadline: Duration) -> Store<Host> {
        let bytes = usize::try_from(self.memory_kb.saturating_mul(1024)).unwrap_or(usize::MAX);
        let mut store = Store::new(self.pre.module().engine(), Host::new(inputs, bytes));
        store.limiter(|h| &mut h.limiter);
        // Fuel is on in the engine, so setting it cannot fail.
        let _ = store.set_fuel(fuel);
        store.set_epoch_deadline(epoch_ticks(deadline));
        store.epoch_deadline_trap();
        store
    }

    fn instantiate(&self, store: &mut Store<Host>) -> wasmtime::Result<Instance> {
        let instance = self.pre.instantiate(&mut *store)?;
        if self.init {
            instance
                .get_typed_func::<(), ()>(&mut *store, "_initialize")?
                .call(&mut *store, ())?;
        }
        Ok(instance)
    }

    /// Calls an export taking nothing and answering an i32, at load, with load-time fuel.
    fn call_at_load(&self, export: &str) -> Result<i32, String> {
        let mut store = self.store(Vec::new(), WASM_LOAD_TICKS, WASM_CALL_DEADLINE);
        let r = self.instantiate(&mut store).and_then(|i| {
            i.get_typed_func::<(), i32>(&mut store, export)?
                .call(&mut store, ())
        });
        r.map_err(|e| format!("{export}() failed: {}", describe(&e, store.data())))
    }

    /// The NUL-terminated string `export()` points at (its `schema()`, `headers()`, `cors()`).
    fn string_at_load(&self, export: &str) -> Result<String, String> {
        let mut store = self.store(Vec::new(), WASM_LOAD_TICKS, WASM_CALL_DEADLINE);
        let r = self.instantiate(&mut store).and_then(|i| {
            let p = i
                .get_typed_func::<(), i32>(&mut store, export)?
                .call(&mut store, ())?;
            c_string(&mut store, &i, p)
        });
        r.map_err(|e| format!("{export}() failed: {}", describe(&e, store.data())))
    }

    /// Runs `migrate(from)`: one step of an object's migration, in the transaction of `cx`
    /// (README "Migrations"). 0 is success; anything else, or a trap, fails the step.
    fn run_migrate(&self, cx: &mut Cx<'_>, from: u32) -> Result<(), AppError> {
        let mut store = self.store(Vec::new(), self.ticks, WASM_CALL_DEADLINE);
        let arg = i32::try_from(from).unwrap_or(i32::MAX);
        let r = Host::with_cx(&mut store, cx, |store| -> wasmtime::Result<i32> {
            let instance = self.instantiate(store)?;
            instance
                .get_typed_func::<i32, i32>(&mut *store, "migrate")?
                .call(&mut *store, arg)
        });
        let host = store.into_data();
        for line in host.output.lines() {
            cx.log(&line);
        }
        match r {
            Ok(0) => Ok(()),
            Ok(code) => Err(sql_detail(
                AppError::new(500, format!("migrate({from}) answered {code}")),
                &host,
            )),
            Err(e) => {
                let what = describe(&e, &host);
                Err(trap_error(&e, &host).with_detail(with_sql(what, &host)))
            }
        }
    }

    /// Runs `handle` (one input) or `handle_batch` (several) in one instance.
    fn run(&self, cx: &mut Cx<'_>, inputs: &[Input<'_>]) -> Result<Vec<Output>, AppError> {
        let batch = inputs.len() > 1;
        let object = cx.object().map(str::to_string);
        let calls = inputs
            .iter()
            .map(|i| CallInput {
                object: object.clone(),
                ..CallInput::new(i)
            })
            .collect();
        let mut store = self.store(calls, self.ticks, WASM_CALL_DEADLINE);
        let r = Host::with_cx(&mut store, cx, |store| -> wasmtime::Result<i32> {
            let instance = self.instantiate(store)?;
            if batch {
                let n = i32::try_from(inputs.len()).unwrap_or(i32::MAX);
                instance
                    .get_typed_func::<i32, i32>(&mut *store, "handle_batch")?
                    .call(&mut *store, n)
            } else {
                instance
                    .get_typed_func::<(), i32>(&mut *store, "handle")?
                    .call(&mut *store, ())
            }
        });
        let host = store.into_data();
        for line in host.output.lines() {
            cx.log(&line);
        }
        let code = match r {
            Ok(code) => code,
            Err(e) => {
                let err = trap_error(&e, &host);
                let what = describe(&e, &host);
                if err.limit().is_none() {
                    cx.log(&format!("trap: {what}"));
                }
                return Err(err.with_detail(with_sql(what, &host)));
            }
        };
        if let Some((status, message)) = host.answers.iter().find_map(|a| a.failure.clone()) {
            return Err(sql_detail(AppError::new(status, message), &host));
        }
        if code != 0 {
            let e = AppError::new(500, format!("the module answered {code} for this input"));
            return Err(sql_detail(e, &host));
        }
        Ok(host
            .answers
            .into_iter()
            .take(inputs.len())
            .map(output)
            .collect())
    }
}

/// An answer as the node's output: a JSON response, or nothing (204 for a request).
fn output(a: Answer) -> Output {
    match a.response {
        Some((status, body)) => {
            let ct = a
                .content_type
                .map_or(std::borrow::Cow::Borrowed("application/json"), Into::into);
            let mut resp = Response::bytes(status, ct, body);
            resp.headers = a.headers;
            Output::Http(resp)
        }
        None => Output::None,
    }
}

/// The epoch ticks of `deadline` (at least one; the epoch may advance just after the store is
/// made, so the deadline falls between `deadline` less a tick and `deadline`).
fn epoch_ticks(deadline: Duration) -> u64 {
    (deadline.as_nanos() / WASM_EPOCH_TICK.as_nanos().max(1)).max(1) as u64
}

/// What stopped a call: a limit, a host call that failed it, or a trap of the module's own.
fn trap_error(e: &wasmtime::Error, host: &Host) -> AppError {
    if let Some(stop) = &host.stopped {
        return stop.clone();
    }
    if host.limiter.tripped {
        return limit_error(Limit::Memory);
    }
    // Out of fuel, or past its wall-time deadline (`WASM_CALL_DEADLINE`): both `cpu_limit`.
    if let Some(Trap::OutOfFuel | Trap::Interrupt) = e.downcast_ref::<Trap>() {
        return limit_error(Limit::Cpu);
    }
    if let Some(Stop(a)) = e.downcast_ref::<Stop>() {
        return a.clone();
    }
    AppError::new(500, "the module trapped on this input")
}

/// What the node's warning of a failed call says besides its message: `what` stopped it, and
/// the last SQL error of the call, if a statement failed.
fn with_sql(what: String, host: &Host) -> String {
    match host.sql.last_failure() {
        Some(sql) => format!("{what}; last SQL error: {sql}"),
        None => what,
    }
}

/// An error the module answered with, with the last SQL error of its call for the node's
/// warning, if a statement failed.
fn sql_detail(e: AppError, host: &Host) -> AppError {
    match host.sql.last_failure() {
        Some(sql) => e.with_detail(format!("last SQL error: {sql}")),
        None => e,
    }
}

/// A one-line account of an error from a module.
fn describe(e: &wasmtime::Error, host: &Host) -> String {
    if let Some(s) = &host.stopped {
        return s.message.clone();
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => format!(
            "the call ran past its wall-time deadline ({} ms, wasm_call_deadline_ms)",
            WASM_CALL_DEADLINE.as_millis()
        ),
        Some(t) => t.to_string(),
        None => e.root_cause().to_string(),
    }
}

/// Reads a NUL-terminated UTF-8 string at `ptr`, of at most [`WASM_TEXT_MAX_BYTES`].
fn c_string(store: &mut Store<Host>, i: &Instance, ptr: i32) -> wasmtime::Result<String> {
    let mem = i
        .get_memory(&mut *store, "memory")
        .ok_or_else(|| wasmtime::Error::msg("no memory"))?;
    let data = mem.data(&*store);
    let start = ptr as u32 as usize;
    let tail = data.get(start..).unwrap_or(&[]);
    let tail = &tail[..tail.len().min(WASM_TEXT_MAX_BYTES + 1)];
    let end = tail.iter().position(|&b| b == 0).ok_or_else(|| {
        wasmtime::Error::msg(format!(
            "no NUL-terminated string of at most {WASM_TEXT_MAX_BYTES} bytes at {ptr}"
        ))
    })?;
    String::from_utf8(tail[..end].to_vec()).map_err(|_| wasmtime::Error::msg("not UTF-8"))
}

impl App for Version {
    fn name(&self) -> &'static str {
        self.name
    }

    fn schema(&self) -> &'static str {
        self.schema
    }

    fn memory_kb(&self) -> Option<u64> {
        Some(self.memory_kb)
    }

    fn resync(&self) -> Resync {
        self.resync
    }

    fn identified(&self) -> bool {
        self.identified
    }

    fn presence(&self) -> bool {
        self.presence
    }

    fn log_retention(&self) -> LogRetention {
        self.retention
    }

    fn schema_version(&self) -> u32 {
        self.schema_version
    }

    fn expiry(&self) -> Option<Duration> {
        self.expiry
    }

    fn migrate(&self, cx: &mut Cx<'_>, from: u32) -> Result<(), AppError> {
        self.run_migrate(cx, from)
    }

    fn wants_header(&self, name: &str) -> bool {
        self.headers.iter().any(|h| h.eq_ignore_ascii_case(name))
    }

    fn cors(&self, origin: &str) -> Option<Cors> {
        let credentials = match self.cors.as_ref()? {
            Origins::Any => false,
            Origins::List(list) => {
                if !list.iter().any(|o| o == origin) {
                    return None;
                }
                true
            }
        };
        Some(Cors {
            credentials,
            max_age_seconds: CORS_MAX_AGE_SECONDS as u32,
        })
    }

    fn retired(&self) -> bool {
        self.retired.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn topic(&self, query: Option<&str>) -> Result<String, AppError> {
        if !self.topic {
            return Ok(String::new());
        }
        let input = CallInput {
            kind: 3,
            query: query.map(str::to_string),
            ..CallInput::default()
        };
        let mut store = self.store(vec![input], WASM_TOPIC_TICKS, WASM_TOPIC_DEADLINE);
        let r = self.instantiate(&mut store).and_then(|i| {
            let p = i
                .get_typed_func::<(), i32>(&mut store, "topic")?
                .call(&mut store, ())?;
            if p == 0 {
                return Ok(String::new());
            }
            c_string(&mut store, &i, p)
        });
        let host = store.into_data();
        for line in host.output.lines() {
            tracing::info!(app = self.name, "topic: {line}");
        }
        let topic = r.map_err(|e| trap_error(&e, &host))?;
        match host.answers.first().and_then(|a| a.failure.clone()) {
            Some((status, message)) => Err(AppError::new(status, message)),
            None => Ok(topic),
        }
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        let mut outs = self.run(cx, std::slice::from_ref(input))?;
        Ok(outs.pop().unwrap_or(Output::None))
    }

    fn handles_batch(&self) -> bool {
        self.batch
    }

    fn handle_batch(&self, cx: &mut Cx<'_>, inputs: &[Input<'_>]) -> Result<Vec<Output>, AppError> {
        match inputs {
            [one] => Ok(vec![self.handle(cx, one)?]),
            _ => self.run(cx, inputs),
        }
    }
}

/// The origins a module's `cors()` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origins {
    /// `*`: any page may call it, without the user's cookies.
    Any,
    /// These (normalised), with the user's cookies.
    List(Vec<String>),
}

/// A module's `headers()`: header field names, comma-separated, at most `app_headers_max`, none
/// of those the node withholds from apps (`APP_HEADERS_WITHHELD`: `authorization`, `cookie`,
/// `proxy-authorization`, `sec-websocket-protocol`).
/// A module's log retention from its `log_retention()`: `frames=<n>`, `bytes=<n>`,
/// `age_ms=<n>`, comma-separated, any of them (the node's for the rest), each from 1 to the
/// node's (`topic_log_frames`, `topic_log_bytes`, `topic_log_age_ms`).
fn retention(text: &str) -> Result<LogRetention, String> {
    let node = LogRetention::NODE;
    let mut r = node;
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = || format!("log_retention() has {item:?}: expected frames=, bytes= or age_ms=");
        let (key, value) = item.split_once('=').ok_or_else(bad)?;
        let n: u64 = value.trim().parse().map_err(|_| bad())?;
        let (max, name) = match key.trim() {
            "frames" => (node.frames, "topic_log_frames"),
            "bytes" => (node.bytes, "topic_log_bytes"),
            "age_ms" => (node.age.as_millis() as u64, "topic_log_age_ms"),
            _ => return Err(bad()),
        };
        if n == 0 || n > max {
            return Err(format!(
                "log_retention() has {item:?}: it must be 1 to {max} ({name})"
            ));
        }
        match key.trim() {
            "frames" => r.frames = n,
            "bytes" => r.bytes = n,
            _ => r.age = Duration::from_millis(n),
        }
    }
    Ok(r)
}

fn header_names(text: &str) -> Result<Vec<String>, String> {
    let names: Vec<String> = text
        .split(',')
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    if names.len() > APP_HEADERS_MAX {
        return Err(format!(
            "headers() names {} fields, past app_headers_max ({APP_HEADERS_MAX})",
            names.len()
        ));
    }
    if let Some(bad) = names.iter().find(|n| {
        n.len() > 64
            || !n
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    }) {
        return Err(format!(
            "headers() names {bad:?}, which is not a header field name"
        ));
    }
    if let Some(secret) = names.iter().find(|n| withheld_header(n)) {
        return Err(format!(
            "headers() names {secret:?}, which the node never hands an app: it carries the \
             client's credentials (an app sees the verified client, never its token)"
        ));
    }
    Ok(names)
}

/// A module's `cors()`: `*`, or origins (`scheme://host[:port]`) comma-separated, at most
/// `app_cors_origins_max`.
fn origins(text: &str) -> Result<Origins, String> {
    if text.trim() == "*" {
        return Ok(Origins::Any);
    }
    let mut list = Vec::new();
    for o in text.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        match combd_kernel::origins::normalize(o) {
            Some(n) => list.push(n),
            None => return Err(format!("cors() names {o:?}, which is not an origin")),
        }
    }
    if list.len() > APP_CORS_ORIGINS_MAX {
        return Err(format!(
            "cors() names {} origins, past app_cors_origins_max ({APP_CORS_ORIGINS_MAX})",
            list.len()
        ));
    }
    Ok(Origins::List(list))
}
