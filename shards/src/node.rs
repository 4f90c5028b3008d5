//! Starting and stopping a node: bind every shard's listeners, start one glommio executor per
//! shard pinned to its CPU, wait until all accept, and drain them on request.

use std::fmt;
use std::net::SocketAddr;
use std::os::fd::{IntoRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use combd_kernel::limits;
use combd_kernel::settings::Settings;
use combd_kernel::sys;
use glommio::{LocalExecutorBuilder, Placement};

use crate::app::Apps;
use crate::fleet::Fleet;
use crate::job::ShardMsg;
use crate::shard::{self, ListenerFd};
use crate::shared::{NodeShared, SharedParts};
use crate::tls::Tls;

/// Why a node could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// A setting's value cannot be served (its port is taken, its address is not on this
    /// machine): the operator must change it.
    Setting {
        /// The setting, e.g. `COMBD_LISTEN`.
        setting: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The machine cannot run the shards as they are built (io_uring refused, an old kernel):
    /// the operator must change the machine or the container.
    Unsupported(String),
    /// Anything else (a shard could not start).
    Runtime(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Setting { setting, message } => write!(f, "{setting}: {message}"),
            StartError::Unsupported(message) | StartError::Runtime(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for StartError {}

/// Asks a running node to drain; cheap to clone and `Send`, for a signal handler thread.
#[derive(Clone)]
pub struct DrainHandle(Arc<NodeShared>);

impl DrainHandle {
    /// Starts the drain: shards stop listening, close WebSockets with 1001, let requests in
    /// flight finish within `COMBD_SHUTDOWN_TIMEOUT`, then exit.
    pub fn drain(&self) {
        self.0.start_drain();
    }
}

enum ShardEvent {
    Ready,
    Exited,
    /// The shard's thread panicked (before its loop started, or at any time after).
    Failed,
}

/// Reports how a shard's thread ended: `Exited` when its loop returned, `Failed` when the
/// thread ended any other way. glommio does not drop a panicked shard's tasks, so the report
/// cannot ride in the shard's future: it is dropped with the closure glommio runs if glommio
/// panics before running it (setting up the shard's rings), and from then on it sits in a
/// thread-local, which the thread drops as it ends, however it ends.
struct ShardEnd {
    id: usize,
    tx: mpsc::Sender<(usize, ShardEvent)>,
    /// Set when the shard's loop returned.
    clean: bool,
}

impl Drop for ShardEnd {
    fn drop(&mut self) {
        let event = if self.clean {
            ShardEvent::Exited
        } else {
            ShardEvent::Failed
        };
        let _ = self.tx.send((self.id, event));
    }
}

/// What one shard is started with: its listeners, its end of the wake socket, its inbox.
struct ShardStart {
    id: usize,
    shared: Arc<NodeShared>,
    listener_fds: Vec<ListenerFd>,
    wake_fd: RawFd,
    inbox: async_channel::Receiver<ShardMsg>,
}

impl ShardStart {
    /// Starts the shard's executor on `cpu`, with its blocking threads; it tells `tx` when it
    /// accepts and when it ends ([`ShardEnd`]).
    fn spawn(self, cpu: usize, tx: mpsc::Sender<(usize, ShardEvent)>) -> std::io::Result<()> {
        let ShardStart {
            id,
            shared,
            listener_fds,
            wake_fd,
            inbox,
        } = self;
        let ready = tx.clone();
        let end = ShardEnd {
            id,
            tx,
            clean: false,
        };
        LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("combd-shard{id}"))
            .io_memory(limits::SHARD_IO_MEMORY_BYTES)
            .ring_depth(limits::SHARD_RING_DEPTH)
            .blocking_thread_pool_placement(glommio::PoolPlacement::Unbound(
                limits::BLOCKING_THREADS_PER_SHARD,
            ))
            .spawn(move || {
                SHARD_END.with(|e| *e.borrow_mut() = Some(end));
                async move {
                    shard::run(id, shared, listener_fds, wake_fd, inbox, move || {
                        let _ = ready.send((id, ShardEvent::Ready));
                    })
                    .await;
                    if let Some(mut end) = SHARD_END.with(|e| e.borrow_mut().take()) {
                        end.clean = true;
                    }
                }
            })
            .map(drop)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}

thread_local! {
    static SHARD_END: std::cell::RefCell<Option<ShardEnd>> = const { std::cell::RefCell::new(None) };
}

/// A running node.
pub struct Node {
    shared: Arc<NodeShared>,
    public_addr: SocketAddr,
    local_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    events: mpsc::Receiver<(usize, ShardEvent)>,
    running: usize,
    /// The locks on the node's ports: held until the node is dropped, after its shards exit.
    _ports: Vec<sys::PortLock>,
}

/// What a node starts with, besides its CPUs.
pub struct NodeConfig {
    /// The validated settings.
    pub settings: Settings,
    /// The built-in apps.
    pub apps: Apps,
    /// `COMBD_MAX_CONNS` after clamping to the fd limit.
    pub max_conns_effective: u64,
    /// Where the memory budget came from, for `/stats`.
    pub memory_budget_source: &'static str,
    /// The memory budget found at start-up, in bytes.
    pub memory_budget_bytes: u64,
    /// Bytes waiting to be written per shard.
    pub outbound_budget_bytes: u64,
    /// Bytes of clients' input waiting in mailboxes and inboxes per shard.
    pub inbound_budget_bytes: u64,
    /// The sending end of the channel the coordinator waits on.
    pub coordinator: mpsc::SyncSender<()>,
    /// The TLS configuration, when TLS is on.
    pub tls: Option<Tls>,
    /// The token verifier, when `COMBD_AUTH_JWT_KEY_FILE` is set.
    pub auth: Option<crate::auth::Auth>,
    /// The access log, when `COMBD_ACCESS_LOG` is not off (started by the caller, who
    /// finishes it once the node has stopped).
    pub access_log: Option<Arc<crate::access_log::AccessLog>>,
}

impl NodeConfig {
    /// The node-wide state's parts: this configuration with what start made for it.
    fn into_parts(
        self,
        shard_wakers: Vec<UnixStream>,
        inboxes: Vec<async_channel::Sender<ShardMsg>>,
        fleet: Option<Arc<Fleet>>,
        (alarms, backup): (
            Arc<crate::alarms::AlarmIndex>,
            Option<Arc<crate::backup::Backup>>,
        ),
    ) -> SharedParts {
        SharedParts {
            settings: self.settings,
            apps: self.apps,
            max_conns_effective: self.max_conns_effective,
            memory_budget_source: self.memory_budget_source,
            memory_budget_bytes: self.memory_budget_bytes,
            outbound_budget_bytes: self.outbound_budget_bytes,
            inbound_budget_bytes: self.inbound_budget_bytes,
            shard_wakers,
            coordinator: self.coordinator,
            inboxes,
            tls: self.tls,
            auth: self.auth,
            fleet,
            access_log: self.access_log,
            alarms,
            backup,
        }
    }
}

/// The backup (`COMBD_BACKUP`) and its writer, when on.
fn start_backup(
    settings: &combd_kernel::settings::Settings,
) -> Result<Option<Arc<crate::backup::Backup>>, StartError> {
    let Some(target) = &settings.backup else {
        return Ok(None);
    };
    let target = backup_target(settings, target)?;
    crate::backup::Backup::start(target, settings.backup_retention)
        .map(Some)
        .map_err(|message| StartError::Setting {
            setting: "COMBD_BACKUP",
            message,
        })
}

/// The backup's target as the settings name it: a bucket's client made with its secret key and
/// the backup key, both read now, and its staging directory (`<data>/backup-staging`, emptied).
pub fn backup_target(
    settings: &combd_kernel::settings::Settings,
    target: &combd_kernel::settings::BackupTarget,
) -> Result<crate::backup::Target, StartError> {
    use combd_kernel::settings::BackupTarget;
    let (bucket, prefix) = match target {
        BackupTarget::Dir(d) => return Ok(crate::backup::Target::Dir(d.clone())),
        BackupTarget::Bucket { bucket, prefix } => (bucket, prefix),
    };
    let setting = |name: &'static str| {
        move |e: combd_kernel::settings::ConfigError| StartError::Setting {
            setting: name,
            message: e.message,
        }
    };
    let Some(s3) = &settings.backup_s3 else {
        return Err(StartError::Setting {
            setting: "COMBD_BACKUP_S3_URL",
            message: "required with an s3:// COMBD_BACKUP".into(),
        });
    };
    let secret = combd_fleet::config::read_secret_key_of(
        "COMBD_BACKUP_S3_SECRET_KEY_FILE",
        &s3.secret_key_file,
    )
    .map_err(setting("COMBD_BACKUP_S3_SECRET_KEY_FILE"))?;
    let key = combd_fleet::auth::read_key_of("COMBD_BACKUP_KEY_FILE", &s3.key_file)
        .map_err(setting("COMBD_BACKUP_KEY_FILE"))?;
    let config = combd_fleet::bucket::BucketConfig {
        endpoint: s3.url.clone(),
        bucket: bucket.clone(),
        region: s3.region.clone(),
        access_key: s3.access_key.clone(),
        secret_key: secret,
    };
    let fail = |message: String| StartError::Setting {
        setting: "COMBD_BACKUP",
        message,
    };
    let client = combd_fleet::bucket::Bucket::new(&config)
        .map_err(|e| StartError::Setting {
            setting: "COMBD_BACKUP_S3_URL",
            message: e.to_string(),
        })?
        .with_fleet_key(Arc::new(key));
    // Reached and allowed now, or the node does not start believing it backs up.
    client
        .any(&format!("{prefix}objects/"))
        .map_err(|e| StartError::Setting {
            setting: "COMBD_BACKUP_S3_URL",
            message: format!("cannot list the backup's bucket: {e}"),
        })?;
    let scratch = settings.data_dir.join("backup-staging");
    let _ = std::fs::remove_dir_all(&scratch);
    crate::backup::BucketTarget::new(client, prefix.clone(), scratch)
        .map(|b| crate::backup::Target::Bucket(Box::new(b)))
        .map_err(|e| fail(format!("cannot make its staging directory: {e}")))
}

/// Finishes the object deletes a crash interrupted (`crate::object_files`), before any shard
/// runs: their files, and their entries in the alarm index of their home shard.
fn finish_removals(
    data_dir: &std::path::Path,
    alarms: &crate::alarms::AlarmIndex,
    shards: usize,
) -> Result<(), StartError> {
    let finished =
        crate::object_files::finish_removals(data_dir).map_err(|e| StartError::Setting {
            setting: "COMBD_DATA",
            message: format!("cannot finish the deletes a crash interrupted: {e}"),
        })?;
    for (app, name) in finished {
        let home = crate::app::home_shard(&app, &name, shards);
        if let Err(e) = alarms.forget(&app, &name, home) {
            tracing::warn!(object = %format!("{app}/{name}"), "cannot forget a deleted object's alarms: {e}");
        }
        tracing::info!(object = %format!("{app}/{name}"), "finished a delete a crash interrupted");
    }
    Ok(())
}

impl Node {
    /// Binds the listeners of every shard on `cpus[..settings.shards]` and starts the shards.
    /// Returns once every shard accepts connections.
    pub fn start(config: NodeConfig, cpus: &[usize]) -> Result<Node, StartError> {
        let n = config.settings.shards;
        // Where io_uring is refused glommio panics in every shard: say why, before binding.
        combd_kernel::uring::probe().map_err(|r| StartError::Unsupported(r.to_string()))?;
        if cpus.len() < n {
            return Err(StartError::Setting {
                setting: "COMBD_SHARDS",
                message: format!("{n} shards need {n} CPUs, {} allowed", cpus.len()),
            });
        }
        let fleet = match &config.settings.fleet {
            Some(f) => Some(Arc::new(Fleet::start(f).map_err(
                |(setting, message)| StartError::Setting { setting, message },
            )?)),
            None => None,
        };
        let alarms = Arc::new(
            crate::alarms::AlarmIndex::open(&config.settings.data_dir, n).map_err(|message| {
                StartError::Setting {
                    setting: "COMBD_DATA",
                    message: format!("cannot open the alarm index: {message}"),
                }
            })?,
        );
        finish_removals(&config.settings.data_dir, &alarms, n)?;
        let backup = start_backup(&config.settings)?;
        let bound = bind_all(&config.settings, n)?;
        let (shard_wakers, wake_fds) = wake_sockets(n)?;
        let (inboxes, inbox_rx): (Vec<_>, Vec<_>) = (0..n)
            .map(|_| async_channel::bounded(limits::CROSS_SHARD_QUEUE))
            .unzip();
        let shared = Arc::new(NodeShared::new(config.into_parts(
            shard_wakers,
            inboxes,
            fleet,
            (alarms, backup),
        )));
        let (tx, events) = mpsc::channel();
        let per_shard = bound.per_shard.into_iter().zip(wake_fds).zip(inbox_rx);
        for (id, ((listener_fds, wake_fd), inbox)) in per_shard.enumerate() {
            let shard = ShardStart {
                id,
                shared: shared.clone(),
                listener_fds,
                wake_fd,
                inbox,
            };
            if let Err(e) = shard.spawn(cpus[id], tx.clone()) {
                shared.start_drain();
                return Err(StartError::Runtime(format!(
                    "cannot start shard {id} on CPU {}: {e}",
                    cpus[id]
                )));
            }
        }
        let node = Node {
            shared,
            public_addr: bound.public,
            local_addr: SocketAddr::from(([127, 0, 0, 1], bound.public.port())),
            tls_addr: bound.tls,
            events,
            running: n,
            _ports: bound.locks,
        };
        node.wait_ready(n)
    }

    /// Waits until every shard accepts; a shard that stops first fails the start.
    fn wait_ready(mut self, n: usize) -> Result<Node, StartError> {
        let mut ready = 0;
        while ready < n {
            match self.events.recv() {
                Ok((_, ShardEvent::Ready)) => ready += 1,
                Ok((id, end @ (ShardEvent::Exited | ShardEvent::Failed))) => {
                    self.running -= 1;
                    self.drain_handle().drain();
                    let how = if matches!(end, ShardEvent::Failed) {
                        "failed (panicked)"
                    } else {
                        "stopped"
                    };
                    return Err(StartError::Runtime(format!(
                        "shard {id} {how} while starting"
                    )));
                }
                Err(_) => {
                    return Err(StartError::Runtime(
                        "every shard stopped while starting".to_string(),
                    ))
                }
            }
        }
        Ok(self)
    }

    /// The public address (with the port resolved).
    pub fn public_addr(&self) -> SocketAddr {
        self.public_addr
    }

    /// The public TLS address, when TLS is on.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// The localhost listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the shards share (stats, settings).
    pub fn shared(&self) -> &Arc<NodeShared> {
        &self.shared
    }

    /// A handle that starts the drain from another thread.
    pub fn drain_handle(&self) -> DrainHandle {
        DrainHandle(self.shared.clone())
    }

    /// Waits until every shard has exited. A shard that fails (its thread panicked) at any
    /// time starts the drain of the others, which get `COMBD_SHUTDOWN_TIMEOUT` and a second to
    /// finish; then the failure is reported, and the process ends: a node never lives on with a
    /// shard that answers nothing.
    pub fn wait(mut self) -> Result<(), String> {
        let mut failed: Option<(usize, Instant)> = None;
        while self.running > 0 {
            let event = match failed {
                None => self.events.recv().map_err(|_| None),
                Some((_, since)) => {
                    let bound = self.shared.settings.shutdown_timeout + Duration::from_secs(1);
                    let left = bound.saturating_sub(since.elapsed());
                    self.events.recv_timeout(left).map_err(Some)
                }
            };
            match event {
                Ok((_, ShardEvent::Exited)) => self.running -= 1,
                Ok((_, ShardEvent::Ready)) => {}
                Ok((id, ShardEvent::Failed)) => {
                    self.running -= 1;
                    self.drain_handle().drain();
                    failed.get_or_insert((id, Instant::now()));
                }
                // Every shard's end reports (`ShardEnd`): none is left to report, or the
                // others did not finish draining in time.
                Err(_) => break,
            }
        }
        if let Some((id, _)) = failed {
            return Err(format!(
                "shard {id} failed (panicked: see the message above); the node stopped"
            ));
        }
        // Every object was let go (and, in a fleet, snapshotted): give the lease back so other
        // nodes can claim them now rather than after its TTL.
        if let Some(fleet) = &self.shared.fleet {
            fleet.release();
        }
        Ok(())
    }
}

/// Takes the lock on `port` for the node's life ([`sys::lock_port`]): `SO_REUSEPORT` would
/// let a second node bind a port this one serves and silently take half its connections.
fn lock_port(port: u16, setting: &'static str) -> Result<sys::PortLock, StartError> {
    sys::lock_port(port).map_err(|e| StartError::Setting {
        setting,
        message: if e.kind() == std::io::ErrorKind::AddrInUse {
            format!(
                "port {port} is already served by another combd on this machine; two nodes \
                 on one port would split its connections"
            )
        } else {
            format!("cannot take the lock on port {port}: {e}")
        },
    })
}

/// What `bind_pair` returns: the public listeners, the localhost listeners, the public address
/// with its port resolved, and the port's lock.
type Pair = (
    Vec<socket2::Socket>,
    Vec<socket2::Socket>,
    SocketAddr,
    sys::PortLock,
);

/// How many ports the kernel may pick for a port of 0 before start-up gives up: a port free on
/// the public address can be taken on 127.0.0.1 (by a client's socket or another node), so a
/// port of 0 tries again with another.
const PORT_ZERO_ATTEMPTS: usize = 16;

/// Binds `n` public listeners on `addr` (a port of 0 resolved once, so all share it) and `n`
/// localhost listeners on `127.0.0.1` with the same port, holding the port's lock before any
/// listener joins the port's `SO_REUSEPORT` group (a port of 0: right after it is resolved,
/// before anything listens on it but the first). A port of 0 whose localhost side (or lock) is
/// taken is given back and another picked, at most `PORT_ZERO_ATTEMPTS` times. Errors name
/// `setting`.
fn bind_pair(addr: SocketAddr, n: usize, setting: &'static str) -> Result<Pair, StartError> {
    let attempts = if addr.port() == 0 {
        PORT_ZERO_ATTEMPTS
    } else {
        1
    };
    let mut last = None;
    for _ in 0..attempts {
        match bind_pair_once(addr, n, setting) {
            Ok(pair) => return Ok(pair),
            Err((e, true)) => last = Some(e),
            Err((e, false)) => return Err(e),
        }
    }
    Err(last.unwrap_or(StartError::Setting {
        setting,
        message: format!("cannot listen on {addr}"),
    }))
}

/// One attempt of `bind_pair`; the error's flag says another port of 0 may do (the port the
/// kernel picked was taken on 127.0.0.1 or by another node's lock).
fn bind_pair_once(
    addr: SocketAddr,
    n: usize,
    setting: &'static str,
) -> Result<Pair, (StartError, bool)> {
    let picked = addr.port() == 0;
    let in_use = |e: &std::io::Error| picked && e.kind() == std::io::ErrorKind::AddrInUse;
    let mut public = Vec::with_capacity(n);
    let mut local = Vec::with_capacity(n);
    let mut addr = addr;
    let mut lock = match addr.port() {
        0 => None,
        port => Some(lock_port(port, setting).map_err(|e| (e, false))?),
    };
    for i in 0..n {
        let p = sys::bind_listener(addr, limits::LISTEN_BACKLOG).map_err(|e| {
            let message = format!("cannot listen on {addr}: {e}");
            (StartError::Setting { setting, message }, false)
        })?;
        if i == 0 {
            addr = p
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .unwrap_or(addr);
            if lock.is_none() {
                lock = Some(lock_port(addr.port(), setting).map_err(|e| (e, picked))?);
            }
        }
        let l_addr = SocketAddr::from(([127, 0, 0, 1], addr.port()));
        let l = sys::bind_listener(l_addr, limits::LISTEN_BACKLOG).map_err(|e| {
            let retry = i == 0 && in_use(&e);
            let message = format!("cannot listen on {l_addr} (localhost listener): {e}");
            (StartError::Setting { setting, message }, retry)
        })?;
        public.push(p);
        local.push(l);
    }
    let lock = match lock {
        Some(lock) => lock,
        None => lock_port(addr.port(), setting).map_err(|e| (e, false))?,
    };
    Ok((public, local, addr, lock))
}

/// Every shard's listeners, bound before any shard starts.
struct Bound {
    /// Each shard's listeners: public, localhost, and with TLS on, public TLS and
    /// localhost TLS.
    per_shard: Vec<Vec<ListenerFd>>,
    /// The public address, its port resolved.
    public: SocketAddr,
    /// The public TLS address, when TLS is on.
    tls: Option<SocketAddr>,
    /// The locks on the ports, held for the node's life.
    locks: Vec<sys::PortLock>,
}

/// Binds every listener of `n` shards, so a port of 0 resolves once and every shard (and the
/// localhost listener) shares it.
fn bind_all(settings: &Settings, n: usize) -> Result<Bound, StartError> {
    let (public, local, addr, lock) = bind_pair(settings.listen, n, "COMBD_LISTEN")?;
    let mut locks = vec![lock];
    let fd = |s: socket2::Socket, local: bool, tls: bool| ListenerFd {
        fd: s.into_raw_fd(),
        local,
        tls,
        fleet: false,
    };
    let mut per_shard: Vec<Vec<ListenerFd>> = public
        .into_iter()
        .zip(local)
        .map(|(p, l)| vec![fd(p, false, false), fd(l, true, false)])
        .collect();
    if let Some(f) = &settings.fleet {
        // Its own port (the settings refuse COMBD_LISTEN's, with a port given there).
        locks.push(lock_port(f.node.port(), "COMBD_FLEET_NODE")?);
        for fds in per_shard.iter_mut() {
            let s = sys::bind_listener(f.node, limits::LISTEN_BACKLOG).map_err(|e| {
                StartError::Setting {
                    setting: "COMBD_FLEET_NODE",
                    message: format!("cannot listen on {}: {e}", f.node),
                }
            })?;
            fds.push(ListenerFd {
                fd: s.into_raw_fd(),
                local: false,
                tls: false,
                fleet: true,
            });
        }
    }
    let mut tls = None;
    if let Some(t) = &settings.tls {
        let (tp, tl, tls_addr, lock) = bind_pair(t.listen, n, "COMBD_TLS_LISTEN")?;
        locks.push(lock);
        for (fds, (p, l)) in per_shard.iter_mut().zip(tp.into_iter().zip(tl)) {
            fds.push(fd(p, false, true));
            fds.push(fd(l, true, true));
        }
        tls = Some(tls_addr);
    }
    Ok(Bound {
        per_shard,
        public: addr,
        tls,
        locks,
    })
}

/// One non-blocking socket pair per shard: the coordinator's ends, and the shards' fds.
fn wake_sockets(n: usize) -> Result<(Vec<UnixStream>, Vec<RawFd>), StartError> {
    let fail = |e: std::io::Error| StartError::Runtime(format!("wake socket: {e}"));
    let mut ours = Vec::with_capacity(n);
    let mut theirs = Vec::with_capacity(n);
    for _ in 0..n {
        let (o, t) = UnixStream::pair().map_err(fail)?;
        o.set_nonblocking(true).map_err(fail)?;
        t.set_nonblocking(true).map_err(fail)?;
        ours.push(o);
        theirs.push(t.into_raw_fd());
    }
    Ok((ours, theirs))
}
