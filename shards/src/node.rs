//! Starting and stopping a node: bind every shard's listeners, start one glommio executor per
//! shard pinned to its CPU, wait until all accept, and drain them on request.

use std::io::Write as _;
use std::net::SocketAddr;
use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use combd_kernel::limits;
use combd_kernel::settings::Settings;
use combd_kernel::sys;
use glommio::{LocalExecutorBuilder, Placement};

use crate::admission::Admission;
use crate::app::Apps;
use crate::cells::ShardMsg;
use crate::shard::{ListenerFd, Shard};
use crate::stats::{self, Kind, NodeFigures, ShardStats};
use crate::tls::Tls;

/// What every shard of a node shares: settings, apps, every shard's stats, the drain flag.
pub struct NodeShared {
    /// The validated settings.
    pub settings: Settings,
    /// The built-in apps.
    pub apps: Apps,
    /// One entry per shard, written only by that shard.
    pub stats: Box<[ShardStats]>,
    /// `COMBD_MAX_CONNS` after clamping to the fd limit.
    pub max_conns_effective: u64,
    /// The admission state the coordinator publishes.
    pub admission: Admission,
    /// Where the memory budget came from.
    pub memory_budget_source: &'static str,
    /// Bytes waiting to be written per shard, every connection together
    /// (`COMBD_OUTBOUND_BUDGET`, else a quarter of the memory budget split over the shards).
    pub outbound_budget_bytes: u64,
    started: Instant,
    draining: AtomicBool,
    /// Open connections on every shard and listener: reserved at accept, released when the
    /// connection closes. The connection cap is checked against it atomically, so shards
    /// accepting at once cannot overshoot the cap together.
    conns_open: AtomicU64,
    /// The coordinator's end of each shard's wake socket.
    shard_wakers: Vec<UnixStream>,
    /// Wakes the coordinator (a burst of accepts, the connection cap reached).
    coordinator: mpsc::SyncSender<()>,
    /// Each shard's inbox, for jobs, deliveries and broadcasts from the other shards.
    pub(crate) inboxes: Vec<async_channel::Sender<ShardMsg>>,
    /// The TLS configuration, when TLS is on.
    pub tls: Option<Tls>,
}

impl NodeShared {
    /// Whether the node is draining for shutdown.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Wakes every shard so it re-reads the admission state (and the drain flag).
    pub fn wake_shards(&self) {
        for w in &self.shard_wakers {
            // Non-blocking: a full socket already holds a wake the shard has yet to read.
            let _ = (&*w).write(&[1]);
        }
    }

    /// Asks the coordinator to measure now.
    pub fn wake_coordinator(&self) {
        let _ = self.coordinator.try_send(());
    }

    /// Milliseconds since the node started.
    pub fn uptime_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Whether every shard's housekeeping tick ran within `within_ms`: a stalled shard makes
    /// this false, and the node stops its watchdog pings.
    pub fn shards_alive(&self, within_ms: u64) -> bool {
        let now = self.uptime_ms();
        self.stats
            .iter()
            .all(|s| now.saturating_sub(s.heartbeat_ms.load(Ordering::Relaxed)) <= within_ms)
    }

    /// Open connections on every shard.
    pub fn conns(&self) -> u64 {
        self.conns_open.load(Ordering::Relaxed)
    }

    /// Reserves a connection; returns how many are open with it.
    pub(crate) fn reserve_conn(&self) -> u64 {
        self.conns_open.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Releases a connection reserved with [`NodeShared::reserve_conn`].
    pub(crate) fn release_conn(&self) {
        self.conns_open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Every limit in force, settings and constants, for `/stats`.
    pub fn limits(&self) -> Vec<(&'static str, u64)> {
        let s = &self.settings;
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        vec![
            ("max_conns", self.max_conns_effective),
            ("max_body_bytes", s.max_body_bytes),
            ("header_timeout_ms", ms(s.header_timeout)),
            ("body_timeout_ms", ms(s.body_timeout)),
            ("idle_timeout_ms", ms(s.idle_timeout)),
            ("ws_max_message_bytes", s.ws_max_message_bytes),
            ("shutdown_timeout_ms", ms(s.shutdown_timeout)),
            ("max_awake", s.max_awake as u64),
            ("restores_at_once", s.restores_at_once as u64),
            ("cpu_limit_ticks", s.cpu_limit_ticks),
            ("db_max_bytes", s.db_max_bytes),
            ("ws_rate", s.ws_rate),
            ("ws_burst", s.ws_burst),
            ("outbound_budget_bytes", self.outbound_budget_bytes),
            ("ws_slow_close_bytes", limits::WS_SLOW_CLOSE_BYTES),
            ("sends_max_bytes", limits::SENDS_MAX_BYTES),
            ("log_max_bytes", limits::LOG_MAX_BYTES as u64),
            ("sql_value_max_bytes", limits::SQL_VALUE_MAX_BYTES as u64),
            ("sql_statement_ms", ms(limits::SQL_STATEMENT_LIMIT)),
            ("host_time_ms", ms(limits::HOST_TIME_LIMIT)),
            ("url_max_bytes", limits::URL_MAX_BYTES as u64),
            ("tls_handshake_timeout_ms", ms(s.tls_handshake_timeout)),
            ("tls_handshakes_max", limits::TLS_HANDSHAKES_MAX as u64),
            ("ws_ping_interval_ms", ms(s.ws_ping_interval)),
            (
                "blocking_threads_per_shard",
                limits::BLOCKING_THREADS_PER_SHARD as u64,
            ),
            (
                "header_section_max_bytes",
                limits::HEADER_SECTION_MAX_BYTES as u64,
            ),
            ("header_count_max", limits::HEADER_COUNT_MAX as u64),
            ("listen_backlog", limits::LISTEN_BACKLOG as u64),
            ("mailbox_default", limits::MAILBOX_DEFAULT as u64),
            ("batch_default", limits::BATCH_DEFAULT as u64),
            ("session_mailbox", limits::SESSION_MAILBOX as u64),
            (
                "session_mailbox_behind",
                limits::SESSION_MAILBOX_BEHIND as u64,
            ),
            ("cross_shard_queue", limits::CROSS_SHARD_QUEUE as u64),
            ("object_idle_ms", ms(limits::OBJECT_IDLE)),
            (
                "object_idle_under_pressure_ms",
                ms(limits::OBJECT_IDLE_UNDER_PRESSURE),
            ),
            ("close_linger_ms", ms(limits::CLOSE_LINGER)),
            ("write_stall_timeout_ms", ms(limits::WRITE_STALL_TIMEOUT)),
        ]
    }

    /// The node-wide figures of `/stats`.
    pub fn figures(&self) -> NodeFigures {
        use Kind::*;
        let a = &self.admission;
        let g = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
        NodeFigures {
            uptime_ms: self.started.elapsed().as_millis() as u64,
            max_conns_effective: self.max_conns_effective,
            draining: self.draining() as u64,
            memory_budget_source: self.memory_budget_source,
            full_reason: a.full_reason(),
            limits: self.limits(),
            figures: vec![
                (
                    "tcp_refusing",
                    "combd_tcp_refusing",
                    Gauge,
                    "1 while the node refuses new connections at TCP.",
                    a.refusing() as u64,
                ),
                (
                    "pressure",
                    "combd_pressure",
                    Gauge,
                    "Memory pressure level, 0, 1 or 2.",
                    a.pressure.load(Ordering::Relaxed) as u64,
                ),
                (
                    "memory_own_bytes",
                    "combd_memory_own_bytes",
                    Gauge,
                    "Memory the node counts as its own.",
                    g(&a.memory_own_bytes),
                ),
                (
                    "memory_rss_bytes",
                    "combd_memory_rss_bytes",
                    Gauge,
                    "Resident set of the process.",
                    g(&a.memory_rss_bytes),
                ),
                (
                    "memory_own_percent",
                    "combd_memory_own_percent",
                    Gauge,
                    "Own memory as a percentage of the budget.",
                    g(&a.memory_own_percent),
                ),
                (
                    "memory_budget_bytes",
                    "combd_memory_budget_bytes",
                    Gauge,
                    "The memory budget.",
                    g(&a.memory_budget_bytes),
                ),
                (
                    "machine_total_bytes",
                    "combd_machine_total_bytes",
                    Gauge,
                    "The machine's memory (MemTotal).",
                    g(&a.machine_total_bytes),
                ),
                (
                    "machine_available_bytes",
                    "combd_machine_available_bytes",
                    Gauge,
                    "The machine's available memory (MemAvailable).",
                    g(&a.machine_available_bytes),
                ),
                (
                    "machine_percent",
                    "combd_machine_percent",
                    Gauge,
                    "Machine memory used, as a percentage of the machine less a tenth.",
                    g(&a.machine_percent),
                ),
                (
                    "tcp_kernel_bytes",
                    "combd_tcp_kernel_bytes",
                    Gauge,
                    "Kernel TCP buffer memory, machine-wide.",
                    g(&a.tcp_kernel_bytes),
                ),
                (
                    "listen_stops",
                    "combd_listen_stops_total",
                    Counter,
                    "Times the node stopped listening.",
                    g(&a.listen_stops),
                ),
                (
                    "disk_low",
                    "combd_disk_low",
                    Gauge,
                    "1 while the data disk is low.",
                    a.disk_low() as u64,
                ),
                (
                    "disk_free_bytes",
                    "combd_disk_free_bytes",
                    Gauge,
                    "Free bytes on the data disk.",
                    g(&a.disk_free_bytes),
                ),
                (
                    "measurements",
                    "combd_measurements_total",
                    Counter,
                    "Admission measurements taken.",
                    g(&a.measurements),
                ),
                (
                    "tls_reloads",
                    "combd_tls_reloads_total",
                    Counter,
                    "TLS certificate reloads that took effect.",
                    self.tls.as_ref().map_or(0, |t| g(&t.reloads)),
                ),
                (
                    "tls_reload_failures",
                    "combd_tls_reload_failures_total",
                    Counter,
                    "TLS certificate reloads refused.",
                    self.tls.as_ref().map_or(0, |t| g(&t.reload_failures)),
                ),
            ],
        }
    }

    /// `/stats` as JSON.
    pub fn stats_json(&self) -> String {
        stats::render_json(&self.figures(), &self.stats)
    }

    /// `/metrics` in Prometheus text.
    pub fn metrics_text(&self) -> String {
        stats::render_metrics(&self.figures(), &self.stats)
    }
}

/// Asks a running node to drain; cheap to clone and `Send`, for a signal handler thread.
#[derive(Clone)]
pub struct DrainHandle(Arc<NodeShared>);

impl DrainHandle {
    /// Starts the drain: shards stop listening, close WebSockets with 1001, let requests in
    /// flight finish within `COMBD_SHUTDOWN_TIMEOUT`, then exit.
    pub fn drain(&self) {
        self.0.draining.store(true, Ordering::Relaxed);
        self.0.wake_shards();
        self.0.wake_coordinator();
    }
}

enum ShardEvent {
    Ready,
    Exited(Result<(), String>),
}

/// A running node.
pub struct Node {
    shared: Arc<NodeShared>,
    public_addr: SocketAddr,
    local_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    events: mpsc::Receiver<(usize, ShardEvent)>,
    running: usize,
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
    /// Bytes waiting to be written per shard.
    pub outbound_budget_bytes: u64,
    /// The sending end of the channel the coordinator waits on.
    pub coordinator: mpsc::SyncSender<()>,
    /// The TLS configuration, when TLS is on.
    pub tls: Option<Tls>,
}

impl Node {
    /// Binds the listeners of every shard on `cpus[..settings.shards]` and starts the shards.
    /// Returns once every shard accepts connections.
    pub fn start(config: NodeConfig, cpus: &[usize]) -> Result<Node, String> {
        let NodeConfig {
            settings,
            apps,
            max_conns_effective,
            memory_budget_source,
            outbound_budget_bytes,
            coordinator,
            tls,
        } = config;
        let n = settings.shards;
        if cpus.len() < n {
            return Err(format!("{n} shards need {n} CPUs, {} allowed", cpus.len()));
        }
        // Bind every listener before any shard starts, so a port of 0 resolves once and every
        // shard (and the localhost listener) shares it.
        let (public, local, addr) = bind_pair(settings.listen, n, "COMBD_LISTEN")?;
        let tls_bound = match &settings.tls {
            Some(t) => Some(bind_pair(t.listen, n, "COMBD_TLS_LISTEN")?),
            None => None,
        };
        let tls_addr = tls_bound.as_ref().map(|b| b.2);
        let mut per_shard: Vec<Vec<ListenerFd>> = public
            .into_iter()
            .zip(local)
            .map(|(p, l)| {
                vec![
                    ListenerFd {
                        fd: p.into_raw_fd(),
                        local: false,
                        tls: false,
                    },
                    ListenerFd {
                        fd: l.into_raw_fd(),
                        local: true,
                        tls: false,
                    },
                ]
            })
            .collect();
        if let Some((tp, tl, _)) = tls_bound {
            for (fds, (p, l)) in per_shard.iter_mut().zip(tp.into_iter().zip(tl)) {
                fds.push(ListenerFd {
                    fd: p.into_raw_fd(),
                    local: false,
                    tls: true,
                });
                fds.push(ListenerFd {
                    fd: l.into_raw_fd(),
                    local: true,
                    tls: true,
                });
            }
        }
        let local_addr = SocketAddr::from(([127, 0, 0, 1], addr.port()));
        let mut shard_wakers = Vec::with_capacity(n);
        let mut shard_wake_fds = Vec::with_capacity(n);
        for _ in 0..n {
            let (ours, theirs) = UnixStream::pair().map_err(|e| format!("wake socket: {e}"))?;
            ours.set_nonblocking(true)
                .map_err(|e| format!("wake socket: {e}"))?;
            theirs
                .set_nonblocking(true)
                .map_err(|e| format!("wake socket: {e}"))?;
            shard_wakers.push(ours);
            shard_wake_fds.push(theirs.into_raw_fd());
        }
        let (inboxes, mut inbox_rx): (Vec<_>, Vec<_>) = (0..n)
            .map(|_| async_channel::bounded(limits::CROSS_SHARD_QUEUE))
            .unzip();
        let shared = Arc::new(NodeShared {
            settings,
            apps,
            stats: (0..n).map(|_| ShardStats::default()).collect(),
            max_conns_effective,
            admission: Admission::default(),
            memory_budget_source,
            outbound_budget_bytes,
            started: Instant::now(),
            draining: AtomicBool::new(false),
            conns_open: AtomicU64::new(0),
            shard_wakers,
            coordinator,
            inboxes,
            tls,
        });
        let (tx, events) = mpsc::channel();
        for (id, (listener_fds, wake_fd)) in per_shard.into_iter().zip(shard_wake_fds).enumerate() {
            let for_shard = shared.clone();
            let tx = tx.clone();
            let inbox = inbox_rx.remove(0);
            let spawned = LocalExecutorBuilder::new(Placement::Fixed(cpus[id]))
                .name(&format!("combd-shard{id}"))
                .io_memory(limits::SHARD_IO_MEMORY_BYTES)
                .blocking_thread_pool_placement(glommio::PoolPlacement::Unbound(
                    limits::BLOCKING_THREADS_PER_SHARD,
                ))
                .spawn(move || async move {
                    let ready = tx.clone();
                    let result =
                        Shard::run(id, for_shard, listener_fds, wake_fd, inbox, move || {
                            let _ = ready.send((id, ShardEvent::Ready));
                        })
                        .await;
                    let _ = tx.send((id, ShardEvent::Exited(result)));
                });
            if let Err(e) = spawned {
                shared.draining.store(true, Ordering::Relaxed);
                return Err(format!("cannot start shard {id} on CPU {}: {e}", cpus[id]));
            }
        }
        drop(tx);
        let mut node = Node {
            shared,
            public_addr: addr,
            local_addr,
            tls_addr,
            events,
            running: n,
        };
        let mut ready = 0;
        while ready < n {
            match node.events.recv() {
                Ok((_, ShardEvent::Ready)) => ready += 1,
                Ok((id, ShardEvent::Exited(r))) => {
                    node.running -= 1;
                    node.drain_handle().drain();
                    return Err(format!(
                        "shard {id} stopped while starting: {}",
                        r.err().unwrap_or_default()
                    ));
                }
                Err(_) => return Err("every shard stopped while starting".to_string()),
            }
        }
        Ok(node)
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

    /// Waits until every shard has exited. A shard that fails starts the drain of the others;
    /// the first failure is returned.
    pub fn wait(mut self) -> Result<(), String> {
        let mut first_error = None;
        while self.running > 0 {
            match self.events.recv() {
                Ok((id, ShardEvent::Exited(r))) => {
                    self.running -= 1;
                    if let Err(e) = r {
                        self.drain_handle().drain();
                        first_error.get_or_insert(format!("shard {id}: {e}"));
                    }
                }
                Ok((_, ShardEvent::Ready)) => {}
                Err(_) => {
                    // A shard thread ended without reporting: it panicked.
                    self.drain_handle().drain();
                    first_error.get_or_insert("a shard panicked".to_string());
                    break;
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// Binds `n` public listeners on `addr` (a port of 0 resolved once, so all share it) and `n`
/// localhost listeners on `127.0.0.1` with the same port. Errors name `setting`.
fn bind_pair(
    addr: SocketAddr,
    n: usize,
    setting: &str,
) -> Result<(Vec<socket2::Socket>, Vec<socket2::Socket>, SocketAddr), String> {
    let mut public = Vec::with_capacity(n);
    let mut local = Vec::with_capacity(n);
    let mut addr = addr;
    for i in 0..n {
        let p = sys::bind_listener(addr, limits::LISTEN_BACKLOG)
            .map_err(|e| format!("{setting}: cannot listen on {addr}: {e}"))?;
        if i == 0 {
            addr = p
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .unwrap_or(addr);
        }
        let l_addr = SocketAddr::from(([127, 0, 0, 1], addr.port()));
        let l = sys::bind_listener(l_addr, limits::LISTEN_BACKLOG).map_err(|e| {
            format!("{setting}: cannot listen on {l_addr} (localhost listener): {e}")
        })?;
        public.push(p);
        local.push(l);
    }
    Ok((public, local, addr))
}
