//! The real servers the fleet tests run against, each started by the test on free loopback
//! ports in a temporary directory of its own and stopped (killed, its directory removed) when
//! the test's handle drops: etcd (Debian's `etcd-server`) and Garage (an S3 server). A test
//! whose server is not installed is skipped with one line saying how to install it
//! (`tools/fleet-env/install`). Every wait is bounded and fails with "timed out waiting for ...".

#![allow(dead_code, clippy::unwrap_used)]

// The node's tests load this file and their own support, which has it too.
#[allow(clippy::duplicate_mod)]
#[path = "../../../tests/support/skip.rs"]
mod skip;
pub use skip::skipped;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use combd_fleet::bucket::BucketConfig;

pub mod db;

/// How long a server may take to start and answer.
pub const START_WAIT: Duration = Duration::from_secs(30);

/// The access key the tests' Garage is given (Garage's format: `GK` and 24 hex digits).
pub const ACCESS_KEY: &str = "GK0123456789abcdef01234567";
/// Its secret key (64 hex digits).
pub const SECRET_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
/// The tests' bucket.
pub const BUCKET: &str = "combd-test";

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory under the system's temporary directory.
/// The fleet key the tests seal with.
pub fn fleet_key() -> std::sync::Arc<combd_fleet::auth::FleetKey> {
    std::sync::Arc::new(
        combd_fleet::auth::parse_fleet_key("combd-fleet-tests-key-0123456789abcdef").unwrap(),
    )
}

pub fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "combd-fleet-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A port nobody listens on now (the kernel's pick for port 0 on 127.0.0.1), and never one
/// this process was given before: the kernel may hand a port it just freed to the next bind,
/// and two tests starting servers at once were once given the same port (the second etcd
/// failed to bind, and its test used the first test's etcd).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// `name` on `PATH` or in `~/.cargo/bin`, if installed.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo/bin"));
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(home)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Polls `ready` until it is true, failing with "timed out waiting for `what`" past `limit`.
/// For an external process, which has no event to wait on.
pub fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed, and its directory removed, on drop.
struct Server {
    child: Child,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn(cmd: &mut Command, dir: &Path, log: &str) -> Child {
    let log = std::fs::File::create(dir.join(log)).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// A single-member etcd on loopback.
pub struct Etcd {
    server: Server,
    /// Its client endpoint, `http://127.0.0.1:<port>`.
    pub endpoint: String,
}

impl Etcd {
    /// Starts etcd and waits until it answers; `None` (and one printed line) if it is not
    /// installed.
    pub fn start(test: &str) -> Option<Etcd> {
        Etcd::start_with(test, "http", &[], &ureq::Agent::new_with_defaults())
    }

    /// Starts etcd with its client URL's `scheme` (`https` needs `args` naming its certificate
    /// files) and `args` more, and waits until it answers `agent` (which shows it what it
    /// asks a client for); `None` (and one printed line) if it is not installed.
    pub fn start_with(
        test: &str,
        scheme: &str,
        args: &[String],
        agent: &ureq::Agent,
    ) -> Option<Etcd> {
        let Some(bin) = find_binary("etcd") else {
            skipped(&format!(
                "{test}: etcd is not installed (tools/fleet-env/install, or apt-get install \
                 etcd-server)"
            ));
            return None;
        };
        let dir = temp_dir("etcd");
        // A name of its own, so that the etcd answering is known to be this one: if another
        // process took a port between the pick and etcd's bind, this etcd exits, and it is
        // started again on new ports.
        let name = format!(
            "test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let deadline = Instant::now() + START_WAIT;
        loop {
            let (client, peer) = (free_port(), free_port());
            let endpoint = format!("{scheme}://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let child = spawn(
                Command::new(&bin)
                    .arg(format!("--name={name}"))
                    .arg(format!("--data-dir={}", dir.join("data").display()))
                    .arg(format!("--listen-client-urls={endpoint}"))
                    .arg(format!("--advertise-client-urls={endpoint}"))
                    .arg(format!("--listen-peer-urls={peer_url}"))
                    .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                    .arg(format!("--initial-cluster={name}={peer_url}"))
                    .arg("--log-level=warn")
                    // As tools/fleet-env/up runs it (README, "The fleet": etcd kept small).
                    .args([
                        "--auto-compaction-mode=periodic",
                        "--auto-compaction-retention=5m",
                    ])
                    .args(args),
                &dir,
                "etcd.log",
            );
            let mut etcd = Etcd {
                server: Server {
                    child,
                    dir: dir.clone(),
                },
                endpoint,
            };
            let members = format!("{}/v3/cluster/member/list", etcd.endpoint);
            let mut exited = false;
            wait_until("etcd to answer its member list", START_WAIT, || {
                exited = matches!(etcd.server.child.try_wait(), Ok(Some(_)));
                exited
                    || agent
                        .post(&members)
                        .send("{}")
                        .ok()
                        .and_then(|mut r| r.body_mut().read_to_string().ok())
                        .is_some_and(|b| b.contains(&format!("\"name\":\"{name}\"")))
            });
            if !exited {
                return Some(etcd);
            }
            assert!(
                Instant::now() < deadline,
                "etcd exited at start each time: {}",
                std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default()
            );
            // Its directory is reused by the next try; this handle must not remove it.
            etcd.server.dir = PathBuf::new();
            let _ = std::fs::remove_dir_all(dir.join("data"));
        }
    }

    /// Turns etcd's authentication on (RBAC): a `root` user, and `user` with `password`,
    /// allowed to read and write the keys under `prefix` and nothing else. Through `agent`.
    pub fn enable_auth(&self, agent: &ureq::Agent, user: &str, password: &str, prefix: &str) {
        use base64::Engine as _;
        let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().unwrap() += 1;
        let call = |path: &str, body: serde_json::Value| {
            let mut r = agent
                .post(&format!("{}/v3/auth/{path}", self.endpoint))
                .header("content-type", "application/json")
                .send(body.to_string())
                .unwrap();
            let text = r.body_mut().read_to_string().unwrap();
            assert!(r.status().is_success(), "{path}: {text}");
        };
        use serde_json::json;
        call(
            "user/add",
            json!({ "name": "root", "password": "root-password" }),
        );
        call("user/grant", json!({ "user": "root", "role": "root" }));
        call("user/add", json!({ "name": user, "password": password }));
        call("role/add", json!({ "name": "combd-node" }));
        call(
            "role/grant",
            json!({ "name": "combd-node", "perm": {
                "permType": "READWRITE", "key": b64(prefix.as_bytes()), "range_end": b64(&end) } }),
        );
        call("user/grant", json!({ "user": user, "role": "combd-node" }));
        call("enable", json!({}));
    }
}

/// The S3 server a test runs against: a Garage it starts, or, when `COMBD_FLEET_TEST_S3` is
/// set to `endpoint,bucket,region,access_key,secret_key`, that server (to check the client
/// against another S3 implementation; the bucket must exist and be empty of `combd-test-*`
/// keys).
pub struct S3 {
    _garage: Option<Garage>,
    /// How to reach its bucket.
    pub bucket: BucketConfig,
}

impl S3 {
    /// The server for `test`; `None` (and one printed line) if none is installed.
    pub fn start(test: &str) -> Option<S3> {
        if let Ok(spec) = std::env::var("COMBD_FLEET_TEST_S3") {
            let f: Vec<&str> = spec.split(',').collect();
            assert_eq!(
                f.len(),
                5,
                "COMBD_FLEET_TEST_S3=endpoint,bucket,region,access_key,secret_key"
            );
            return Some(S3 {
                _garage: None,
                bucket: BucketConfig {
                    endpoint: f[0].into(),
                    bucket: f[1].into(),
                    region: f[2].into(),
                    access_key: f[3].into(),
                    secret_key: f[4].into(),
                },
            });
        }
        let garage = Garage::start(test)?;
        Some(S3 {
            bucket: garage.bucket.clone(),
            _garage: Some(garage),
        })
    }

    /// A key prefix no other test run uses.
    pub fn unique_prefix(&self) -> String {
        format!(
            "combd-test-{}-{}-{}/",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )
    }
}

/// A single-node Garage on loopback with one bucket and one key allowed on it.
pub struct Garage {
    server: Server,
    config_path: PathBuf,
    bin: PathBuf,
    /// How to reach its bucket.
    pub bucket: BucketConfig,
}

impl Garage {
    /// Starts Garage, lays out its one node, creates the tests' key and bucket; `None` (and
    /// one printed line) if it is not installed.
    pub fn start(test: &str) -> Option<Garage> {
        let Some(bin) = find_binary("garage") else {
            skipped(&format!(
                "{test}: garage is not installed (tools/fleet-env/install builds it into \
                 ~/.cargo/bin)"
            ));
            return None;
        };
        let dir = temp_dir("garage");
        let (rpc, s3, admin) = (free_port(), free_port(), free_port());
        let config_path = dir.join("garage.toml");
        std::fs::write(&config_path, garage_config(&dir, rpc, s3, admin)).unwrap();
        let child = spawn(
            Command::new(&bin).arg("-c").arg(&config_path).arg("server"),
            &dir,
            "garage.log",
        );
        let garage = Garage {
            server: Server { child, dir },
            config_path,
            bin,
            bucket: BucketConfig {
                endpoint: format!("http://127.0.0.1:{s3}"),
                bucket: BUCKET.to_string(),
                region: combd_fleet::bucket::DEFAULT_REGION.to_string(),
                access_key: ACCESS_KEY.to_string(),
                secret_key: SECRET_KEY.to_string(),
            },
        };
        let mut node_id = String::new();
        wait_until("garage to answer `node id`", START_WAIT, || {
            let out = garage.cli(&["node", "id", "-q"]);
            if out.status.success() {
                node_id = String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .split('@')
                    .next()
                    .unwrap_or_default()
                    .to_string();
            }
            !node_id.is_empty()
        });
        garage.must(&["layout", "assign", "-z", "dc1", "-c", "1G", &node_id]);
        garage.must(&["layout", "apply", "--version", "1"]);
        garage.must(&[
            "key",
            "import",
            "--yes",
            "-n",
            "combd-test",
            ACCESS_KEY,
            SECRET_KEY,
        ]);
        // The layout takes effect asynchronously: retry until the bucket can be created.
        wait_until("garage to create the bucket", START_WAIT, || {
            garage.cli(&["bucket", "create", BUCKET]).status.success()
                || garage.cli(&["bucket", "info", BUCKET]).status.success()
        });
        garage.must(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            BUCKET,
            "--key",
            "combd-test",
        ]);
        Some(garage)
    }

    /// Runs the garage command line against this server.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg("-c")
            .arg(&self.config_path)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Runs a command that must succeed; on a loaded machine the command line's RPC to the
    /// server can time out, so a failure is retried until [`START_WAIT`] (seen once in a full
    /// suite: a `layout` or `key` step failed while four tests started their Garage at once).
    /// A retry that finds its work done ("already" applied, exists) counts as done.
    fn must(&self, args: &[&str]) {
        let deadline = Instant::now() + START_WAIT;
        let mut retry = false;
        loop {
            let out = self.cli(args);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if out.status.success() || (retry && text.contains("already")) {
                return;
            }
            retry = true;
            assert!(Instant::now() < deadline, "garage {args:?}: {text}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A one-node Garage's configuration: everything on loopback, SQLite metadata, no replication.
/// `tools/fleet-env/up` writes the same.
fn garage_config(dir: &Path, rpc: u16, s3: u16, admin: u16) -> String {
    format!(
        r#"metadata_dir = "{dir}/meta"
data_dir = "{dir}/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:{rpc}"
rpc_public_addr = "127.0.0.1:{rpc}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "{region}"
api_bind_addr = "127.0.0.1:{s3}"
root_domain = ".s3.localhost"

[admin]
api_bind_addr = "127.0.0.1:{admin}"
"#,
        dir = dir.display(),
        secret = SECRET_KEY,
        region = combd_fleet::bucket::DEFAULT_REGION,
    )
}
