//! The `host_imports` fuzz target's harness: each script's module ([`super::imports`],
//! written by [`super::wat`]) deployed as app `fz` on a real node (the `combd` binary, started
//! once, the module replaced by a SIGHUP reload for each script), and its steps played by
//! real clients on loopback ([`super::clients`]). Nothing of the host is modelled: the node's
//! own imports, cells, SQLite and sandbox answer.
//!
//! After each script:
//! - the node is running, no thread of it panicked (its log says so even for a panic it
//!   caught), and a fresh client is answered;
//! - every request got exactly one answer, each a valid HTTP/1.1 response with a status of
//!   200 to 599 (no content-length and no body on a 204 or 304, no body for a `HEAD`), and
//!   every frame a session got is a valid server frame; none says a caught panic (`the app
//!   failed on this input`) or that a statement the node must refuse ran (`escaped: ...`);
//! - the node comes back to rest (no connection but the one asking, no session, no input);
//! - nothing changed in the node's directory but the files of the script's objects
//!   (`data/objects/fz/{a,b,c}.sqlite*`): not the other app's object, not a sibling object of
//!   the same app, not the compiled-code cache, the apps directory, or `out/` (the node's
//!   working directory and `TMPDIR`, where hostile SQL attaches and vacuums into), and
//!   nothing was created;
//! - every answer `sql_denied` was counted in `/stats` (`sql_denied` rose at least as much);
//! - the node's resident peak during the script ([`Node::reset_peak`]) grew by at most four
//!   times the module's memory limit and [`RSS_SLACK_BYTES`].
//!
//! A module the node refuses to load must be refused for what its exports answered, never
//! because the harness wrote one that does not compile. A broken rule panics with the
//! script, what broke, and the node's log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::clients::{Answer, Heard, HttpConn, Session};
use super::imports::{self, Body, Method, Script, Step, CONNS_MAX, OBJECTS};
use super::node::{Node, Start, WAIT};
use super::wat::{self, Entry, Paths};

/// `COMBD_CPU_LIMIT_TICKS` of the node under test: a tenth of the default, so a script that
/// loops runs out in a fraction of a second in a debug build.
pub const CPU_LIMIT_TICKS: u64 = 10_000_000;
/// What the node's resident peak may grow by during a script besides four times the module's
/// memory limit (its linear memory, what the host holds for it, a copy in flight, its answer
/// on the way out): SQLite's page cache and statements, the sends a call may queue (16 MiB),
/// the clients' buffers, the allocator's slack.
pub const RSS_SLACK_BYTES: u64 = 64 << 20;
/// The app the scripts' modules are deployed as.
const APP: &str = "fz";
/// The address the fresh client after each script comes from (the scripts' are 127.0.3.x).
const HONEST_FROM: [u8; 4] = [127, 0, 2, 2];
/// The module deployed at start: its schema makes table `t`, and each call adds a row.
const FIRST_MODULE: &str = r#"(module
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v);\00")
  (data (i32.const 100) "INSERT INTO t (v) VALUES (1)")
  (data (i32.const 200) "{}")
  (func (export "schema") (result i32) (i32.const 0))
  (func (export "handle") (result i32)
    (drop (call $sql (i32.const 100) (i32.const 28)))
    (call $respond (i32.const 200) (i32.const 200) (i32.const 2))
    (i32.const 0)))
"#;

/// What one script did, for the runs' summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    /// The node loaded the script's module (else it refused it, as it should have).
    pub loaded: bool,
    /// Calls in the module's `handle`.
    pub calls: usize,
    /// Answers to requests and refused attaches.
    pub answers: usize,
    /// Of them, 2xx.
    pub ok: usize,
    /// Answers and session errors `sql_denied`.
    pub denied: usize,
    /// Answers and session errors for a limit (`cpu_limit`, `memory_limit`, ...).
    pub limits: usize,
    /// Sessions that attached.
    pub sessions: usize,
    /// Bytes of messages the sessions were sent.
    pub heard_bytes: u64,
    /// How much the node's resident peak grew during the script.
    pub peak_growth_bytes: u64,
}

/// A running node, and what the scripts' modules are given.
pub struct Harness {
    node: Node,
    dict: Vec<(u32, Entry)>,
    serial: u64,
    /// `reloads + reloads_refused` of the app after the last deploy.
    deploys: u64,
    /// Clients opened, for their addresses.
    clients: usize,
}

impl Harness {
    /// Starts `bin` with app `fz` deployed, then makes the objects a script must not touch:
    /// `fz/sibling` and `counter/victim`, each with a row, closed.
    pub fn start(bin: &Path) -> Harness {
        let dir = Node::fresh_dir("host");
        for d in ["apps", "out"] {
            std::fs::create_dir_all(dir.join(d)).expect("make the harness's directories");
        }
        std::fs::write(dir.join("apps/fz.wat"), FIRST_MODULE).expect("write the first module");
        let out = dir.join("out");
        let env = vec![
            ("COMBD_APPS_DIR", dir.join("apps").into_os_string()),
            ("COMBD_CPU_LIMIT_TICKS", CPU_LIMIT_TICKS.to_string().into()),
            // Thousands of scripts from 250 addresses: the accept rate is not fuzzed.
            ("COMBD_ACCEPT_RATE_PER_ADDRESS", "1000000".into()),
            ("TMPDIR", out.clone().into_os_string()),
        ];
        let node = Node::start(
            bin,
            Start {
                dir: dir.clone(),
                env,
                log: ("error", true),
                cwd: Some(out.clone()),
            },
        );
        let paths = Paths {
            out,
            data: node.data_dir(),
        };
        let mut h = Harness {
            dict: wat::dictionary(&paths),
            node,
            serial: 0,
            deploys: 0,
            clients: 0,
        };
        for (method, path) in [("POST", "/o/fz/sibling"), ("POST", "/o/counter/victim")] {
            let a = h.honest(method, path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                a.status,
                200,
                "{path}: {:?}",
                String::from_utf8_lossy(&a.body)
            );
        }
        h.deploys = deploys(&h.node.stats());
        h.wait_for("the warm-up's objects to close", |s| s["objects_open"] == 0)
            .unwrap_or_else(|e| panic!("{e}"));
        h
    }

    /// One request from [`HONEST_FROM`] on a new connection; its answer.
    fn honest(&self, method: &str, path: &str) -> Result<Answer, String> {
        let mut c = HttpConn::open(HONEST_FROM, self.node.public())
            .map_err(|e| format!("a fresh client cannot connect: {e}"))?;
        c.queue(method, path, b"");
        let mut a = c
            .answers()
            .map_err(|e| format!("a fresh client's {method} {path}: {e}"))?;
        a.pop().ok_or_else(|| "no answer".to_string())
    }

    /// Polls `/stats` until `done` holds (nothing to wait on but the node's figures).
    fn wait_for(&self, what: &str, done: impl Fn(&Value) -> bool) -> Result<Value, String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.node.stats();
            if done(&s) {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                return Err(format!("timed out waiting for {what}: {s}"));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The node's `/stats`.
    pub fn stats(&self) -> Value {
        self.node.stats()
    }

    /// Plays one script (any bytes: see [`imports::decode`]), then checks the node.
    pub fn run(&mut self, data: &[u8]) -> Outcome {
        let script = imports::decode(data);
        let mut out = Outcome {
            calls: script.module.handle.len(),
            ..Outcome::default()
        };
        let mut broken = Vec::new();
        let (_, earlier) = self.node.take_log();
        if !earlier.is_empty() {
            broken.push(format!(
                "a thread of the node panicked before the script: {earlier:?}"
            ));
        }
        self.serial += 1;
        let text = wat::wat(&script, self.serial, &self.dict);
        if std::env::var_os("COMBD_FUZZ_VERBOSE").is_some_and(|v| v == "wat") {
            eprintln!("{text}");
        }
        let (loaded, mut log) = match self.deploy(&text) {
            Ok(r) => r,
            Err(e) => {
                broken.push(e);
                (false, Vec::new())
            }
        };
        out.loaded = loaded;
        if loaded {
            self.play(&script, &mut out, &mut broken);
        } else if broken.is_empty() {
            let refusal = log.iter().find(|l| l.contains("module refused"));
            let expected = ["memory_kb()", "schema()", "resync()"];
            if !refusal.is_some_and(|l| expected.iter().any(|e| l.contains(e))) {
                broken.push(format!(
                    "the module was refused, and not for what its exports answered: {refusal:?}\n{text}"
                ));
            }
        }
        if let Some(status) = self.node.exited() {
            broken.push(format!("the node exited ({status})"));
        } else {
            match self.honest("GET", "/healthz") {
                Ok(a) if a.status == 200 => {}
                Ok(a) => broken.push(format!("a fresh client was answered {}", a.status)),
                Err(e) => broken.push(e),
            }
        }
        let (lines, panics) = self.node.take_log();
        log.extend(lines);
        if !panics.is_empty() {
            broken.push(format!("a thread of the node panicked: {panics:?}"));
        }
        if !broken.is_empty() {
            panic!(
                "the script {script:?}\nbroke:\n- {}\nthe node's log:\n{}",
                broken.join("\n- "),
                log.join("\n")
            );
        }
        out
    }

    /// Deploys `text` as the app's module (written whole, then SIGHUP): whether the node
    /// loaded it, and its log meanwhile.
    fn deploy(&mut self, text: &str) -> Result<(bool, Vec<String>), String> {
        let apps = self.node.dir.join("apps");
        std::fs::write(apps.join("fz.wat.new"), text).expect("write the module");
        std::fs::rename(apps.join("fz.wat.new"), apps.join("fz.wat")).expect("deploy the module");
        let before = self.node.stats()["apps"][APP]["reloads"]
            .as_u64()
            .unwrap_or(0);
        self.node.signal(nix::sys::signal::Signal::SIGHUP);
        let s = self.wait_for("the module's reload", |s| deploys(s) > self.deploys)?;
        self.deploys = deploys(&s);
        let loaded = s["apps"][APP]["reloads"].as_u64().unwrap_or(0) > before;
        let mut log = Vec::new();
        if !loaded {
            // The refusal is logged just after it is counted.
            let deadline = Instant::now() + WAIT;
            while !log.iter().any(|l: &String| l.contains("module refused")) {
                if Instant::now() >= deadline {
                    return Err("timed out waiting for the refusal's log line".into());
                }
                let (lines, panics) = self.node.take_log();
                log.extend(lines);
                if !panics.is_empty() {
                    return Err(format!("a thread of the node panicked: {panics:?}"));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Ok((loaded, log))
    }

    /// Plays the steps of a loaded script and checks what they left.
    fn play(&mut self, script: &Script, out: &mut Outcome, broken: &mut Vec<String>) {
        let root = self.node.dir.clone();
        let before = snapshot(&root);
        let s = self.node.stats();
        let denied_before = s["sql_denied"].as_u64().unwrap_or(0);
        let limit_bytes = s["apps"][APP]["memory_kb"].as_u64().unwrap_or(0) * 1024;
        let rss_before = self.node.reset_peak();
        let (answers, heard) = match self.steps(script, out) {
            Ok(r) => r,
            Err(e) => {
                broken.push(e);
                (Vec::new(), Heard::default())
            }
        };
        out.answers = answers.len();
        out.heard_bytes = heard.bytes;
        let errors = answers
            .iter()
            .map(|a| (a.status, String::from_utf8_lossy(&a.body).into_owned()))
            .chain(heard.texts.iter().map(|t| (0, t.clone())));
        let verbose = std::env::var_os("COMBD_FUZZ_VERBOSE").is_some();
        for (status, body) in errors {
            if verbose {
                eprintln!(
                    "  answered {status} {}",
                    body.chars().take(300).collect::<String>()
                );
            }
            out.ok += usize::from((200..300).contains(&status));
            // The node's errors are `{"error": message}` (a module's answer may hold any
            // bytes of its memory, the escape messages among them: only errors count).
            let error = serde_json::from_str::<Value>(&body).ok();
            match error.as_ref().and_then(|v| v["error"].as_str()) {
                Some("sql_denied") => out.denied += 1,
                Some(e) if e.ends_with("_limit") => out.limits += 1,
                Some(e)
                    if e.starts_with("escaped: dictionary entry")
                        || e == "the app failed on this input" =>
                {
                    broken.push(format!("answered {status} {body}"));
                }
                _ => {}
            }
        }
        let rest = self.wait_for("the node to come back to rest after the script", |s| {
            s["conns"] == 1 && s["sessions"] == 0 && s["inbound_bytes"] == 0
        });
        let s = match rest {
            Ok(s) => s,
            Err(e) => {
                broken.push(e);
                self.node.stats()
            }
        };
        let denied = s["sql_denied"].as_u64().unwrap_or(0) - denied_before;
        if denied < out.denied as u64 {
            broken.push(format!(
                "{} answers sql_denied, {denied} counted in /stats",
                out.denied
            ));
        }
        out.peak_growth_bytes = self.node.status_bytes("VmHWM").saturating_sub(rss_before);
        let bound = 4 * limit_bytes + RSS_SLACK_BYTES;
        if out.peak_growth_bytes > bound {
            broken.push(format!(
                "the node's resident peak grew by {} bytes, past {bound} (the module may hold \
                 {limit_bytes})",
                out.peak_growth_bytes
            ));
        }
        let after = snapshot(&root);
        for (path, was, is) in changes(&before, &after) {
            broken.push(format!("{path} changed: {was:?} -> {is:?}"));
        }
    }

    /// Plays the clients' steps: the answers to requests and refused attaches, and what the
    /// sessions were sent.
    fn steps(
        &mut self,
        script: &Script,
        out: &mut Outcome,
    ) -> Result<(Vec<Answer>, Heard), String> {
        let to = self.node.public();
        let mut conns: Vec<Option<HttpConn>> = (0..CONNS_MAX).map(|_| None).collect();
        let mut sessions: Vec<Option<Session>> = Vec::new();
        let mut answers = Vec::new();
        let mut heard = Heard::default();
        for step in &script.steps {
            match *step {
                Step::Request {
                    conn,
                    method,
                    object,
                    query,
                    body,
                } => {
                    let c = match &mut conns[usize::from(conn) % CONNS_MAX] {
                        Some(c) => c,
                        slot => slot.insert(HttpConn::open(self.next_client(), to)?),
                    };
                    let body = self.body(body);
                    c.queue(method_name(method), &self.target(object, query), &body);
                }
                Step::Flush => {
                    for c in conns.iter_mut().flatten() {
                        c.flush()?;
                    }
                }
                Step::Attach { object, query } if sessions.len() < CONNS_MAX => {
                    match Session::open(self.next_client(), to, &self.target(object, query))? {
                        Ok(s) => {
                            out.sessions += 1;
                            sessions.push(Some(s));
                        }
                        Err(refused) => answers.push(refused),
                    }
                }
                Step::Attach { .. } => {}
                Step::Message {
                    session,
                    binary,
                    body,
                } => {
                    let n = sessions.len().max(1);
                    if let Some(Some(s)) = sessions.get_mut(usize::from(session) % n) {
                        let payload = self.body(body);
                        s.send(binary || std::str::from_utf8(&payload).is_err(), &payload);
                    }
                }
                Step::Detach { session } => {
                    let n = sessions.len().max(1);
                    if let Some(s) = sessions
                        .get_mut(usize::from(session) % n)
                        .and_then(Option::take)
                    {
                        heard.add(s.close()?);
                    }
                }
            }
        }
        for c in conns.into_iter().flatten() {
            answers.extend(c.answers()?);
        }
        for s in sessions.into_iter().flatten() {
            heard.add(s.close()?);
        }
        Ok((answers, heard))
    }

    fn next_client(&mut self) -> [u8; 4] {
        self.clients += 1;
        [127, 0, 3, (self.clients % 250) as u8 + 1]
    }

    fn body(&self, b: Body) -> Vec<u8> {
        match b {
            Body::Empty => Vec::new(),
            Body::Entry(k) => self.dict[usize::from(k) % self.dict.len()].1.bytes.clone(),
            Body::Filler(n) => vec![b'x'; n as usize],
        }
    }

    /// `/o/fz/<object>`, with dictionary entry `query` percent-encoded as its query.
    fn target(&self, object: u8, query: Option<u8>) -> String {
        let mut t = format!("/o/{APP}/{}", OBJECTS[usize::from(object) % OBJECTS.len()]);
        if let Some(k) = query {
            t.push('?');
            for b in &self.dict[usize::from(k) % self.dict.len()].1.bytes {
                match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'=' => {
                        t.push(char::from(*b))
                    }
                    _ => t.push_str(&format!("%{b:02X}")),
                }
            }
        }
        t
    }
}

fn method_name(m: Method) -> &'static str {
    match m {
        Method::Get => "GET",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Head => "HEAD",
        Method::Patch => "PATCH",
    }
}

/// `reloads + reloads_refused` of the app: one more after each deploy.
fn deploys(s: &Value) -> u64 {
    let a = &s["apps"][APP];
    a["reloads"].as_u64().unwrap_or(0) + a["reloads_refused"].as_u64().unwrap_or(0)
}

/// Whether a script may change `path` (relative to the node's directory): its objects'
/// database files.
fn may_change(path: &str) -> bool {
    let Some(file) = path.strip_prefix("data/objects/fz/") else {
        return false;
    };
    OBJECTS.iter().any(|o| {
        file.strip_prefix(o)
            .and_then(|f| f.strip_prefix(".sqlite"))
            .is_some_and(|rest| ["", "-wal", "-shm", "-journal"].contains(&rest))
    })
}

/// Every entry under `root` by its relative path: a directory, or a file's length and a hash
/// of its bytes (of its modification time in the compiled-code cache, whose files are large;
/// nothing of the files a script may change).
fn snapshot(root: &Path) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            let rel = rel.join(e.file_name());
            let key = rel.to_string_lossy().into_owned();
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                out.insert(key, (u64::MAX, 0));
                dirs.push(rel);
                continue;
            }
            let hash = if may_change(&key) {
                0
            } else if key.starts_with("data/wasm-cache/") {
                meta.modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos() as u64)
            } else {
                std::fs::read(root.join(&rel)).map_or(0, |b| fnv(&b))
            };
            out.insert(key, (meta.len(), hash));
        }
    }
    out
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

type Seen = Option<(u64, u64)>;

/// What changed between two snapshots, but for what a script may change.
fn changes(
    before: &BTreeMap<String, (u64, u64)>,
    after: &BTreeMap<String, (u64, u64)>,
) -> Vec<(String, Seen, Seen)> {
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| !may_change(k))
        .map(|k| (k.clone(), before.get(k).copied(), after.get(k).copied()))
        .filter(|(_, a, b)| a != b)
        .collect()
}

/// The fuzz target's entry: plays `data` against a node started at the first call from the
/// binary `COMBD_BIN` names.
pub fn host_imports(data: &[u8]) {
    use std::sync::{Mutex, OnceLock};
    static HARNESS: OnceLock<Mutex<Harness>> = OnceLock::new();
    let h = HARNESS.get_or_init(|| {
        let bin = std::env::var_os("COMBD_BIN").expect(
            "set COMBD_BIN to a built node binary \
             (cargo build --release -p combd: target/release/combd or combd-test-node)",
        );
        Mutex::new(Harness::start(Path::new(&bin)))
    });
    h.lock().unwrap_or_else(|p| p.into_inner()).run(data);
}
