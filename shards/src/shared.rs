//! What every shard of a node shares: the settings, the apps, every shard's stats, the
//! admission state the coordinator publishes, the node-wide connection count, the shards'
//! inboxes and wake sockets, and the drain flag. Read without locks on the hot path.

use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use combd_kernel::fair::ClientKey;
use combd_kernel::limits;
use combd_kernel::settings::{InForce, Settings};

use crate::access_log::AccessLog;
use crate::addresses::{AddressLimits, Addresses};
use crate::admission::Admission;
use crate::app::Apps;
use crate::fair::{PoolRefusal, PoolSizes, Pools, Share};
use crate::fleet::Fleet;
use crate::job::ShardMsg;
use crate::object_counts::ObjectCounts;
use crate::stats::{self, Field, Kind, NodeFigures, ShardStats};
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
    /// The public connections of each client address, against its share.
    pub addresses: Addresses,
    /// The fleet listener's connections of each peer address, against its share (as many as
    /// a client address, at any rate).
    pub fleet_peers: Addresses,
    /// Where the memory budget came from.
    pub memory_budget_source: &'static str,
    /// Bytes waiting to be written per shard, every connection together
    /// (`COMBD_OUTBOUND_BUDGET`, else a quarter of the memory budget split over the shards).
    pub outbound_budget_bytes: u64,
    /// Bytes of clients' input waiting in mailboxes and inboxes per shard, every connection
    /// together (`COMBD_INBOUND_BUDGET`, else a quarter of the memory budget split over the
    /// shards).
    pub inbound_budget_bytes: u64,
    started: Instant,
    draining: AtomicBool,
    /// Open connections on every shard, by listener kind: reserved at accept, released when
    /// the connection closes. Each cap is checked against its count atomically, so shards
    /// accepting at once cannot overshoot it together.
    conns_open: [AtomicU64; 3],
    /// The coordinator's end of each shard's wake socket.
    shard_wakers: Vec<UnixStream>,
    /// Wakes the coordinator (a burst of accepts, the connection cap reached).
    coordinator: mpsc::SyncSender<()>,
    /// Each shard's inbox, for jobs, deliveries and broadcasts from the other shards.
    pub(crate) inboxes: Vec<async_channel::Sender<ShardMsg>>,
    /// The TLS configuration, when TLS is on.
    pub tls: Option<Tls>,
    /// The token verifier, when `COMBD_AUTH_JWT_KEY_FILE` is set.
    pub auth: Option<crate::auth::Auth>,
    /// This node's part of the fleet, when `COMBD_FLEET_ETCD` is set.
    pub fleet: Option<Arc<Fleet>>,
    /// Per shard: what its sessions missed because its inbox was full.
    pub(crate) missed: Vec<Missed>,
    /// Each app's object databases, against `COMBD_MAX_OBJECTS_PER_APP`.
    pub(crate) objects: ObjectCounts,
    /// The objects live on each shard now, for the operator's listing.
    pub(crate) live: crate::live_objects::LiveObjects,
    /// The access log, when `COMBD_ACCESS_LOG` is not off.
    pub access_log: Option<Arc<AccessLog>>,
    /// The index of objects with alarms (`crate::alarms`).
    pub alarms: Arc<crate::alarms::AlarmIndex>,
    /// The continuous backup, when `COMBD_BACKUP` names a directory (`crate::backup`).
    pub backup: Option<Arc<crate::backup::Backup>>,
    /// The pools shared between clients, each client held to its share (`crate::fair`).
    pub pools: Pools,
    /// Where each verified user is, across the node's objects (`crate::users`).
    pub users: Arc<crate::users::Users>,
}

/// Which cap a connection counts against: where it came in, and from where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    /// A client on a public listener (plain or TLS), or on the localhost listener from an
    /// address that is not loopback: admission and its address's share apply.
    Public = 0,
    /// The node's own machine: the localhost listener, from a loopback address. Never refused
    /// while it has room under its own cap.
    Local = 1,
    /// Another node of the fleet, on the fleet listener.
    Fleet = 2,
}

/// What a shard's sessions missed because another shard could not reach them (its inbox was
/// full): the sessions and the (object, topic) broadcasts. The other shards write it, the
/// shard takes it (its inbox loop and housekeeping tick look): a lock only on this rare path.
#[derive(Default)]
pub(crate) struct Missed {
    any: AtomicBool,
    list: std::sync::Mutex<MissedList>,
}

/// The sessions and broadcasts a shard's sessions missed.
#[derive(Default)]
pub(crate) struct MissedList {
    pub sessions: Vec<u64>,
    pub topics: Vec<(String, String)>,
    /// Objects deleted or restored, whose sessions here are to close, and why.
    pub closed: Vec<(String, crate::job::ObjectGone)>,
}

impl Missed {
    /// A session of this shard missed a delivery.
    pub fn session(&self, id: u64) {
        self.with(|l| l.sessions.push(id));
    }

    /// Object `key` was deleted or restored, and this shard could not be told: its sessions
    /// here close.
    pub fn closed(&self, key: &str, why: crate::job::ObjectGone) {
        self.with(|l| l.closed.push((key.to_string(), why)));
    }

    /// The sessions of object `key` subscribed to `topic` on this shard missed a broadcast.
    pub fn topic(&self, key: &str, topic: &str) {
        self.with(|l| l.topics.push((key.to_string(), topic.to_string())));
    }

    fn with(&self, f: impl FnOnce(&mut MissedList)) {
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut list);
        self.any.store(true, Ordering::Release);
    }

    /// What was missed since the last call, if anything.
    pub fn take(&self) -> Option<MissedList> {
        if !self.any.swap(false, Ordering::Acquire) {
            return None;
        }
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        Some(std::mem::take(&mut *list))
    }
}

/// What a node's shared state is made of, besides what it makes itself.
pub(crate) struct SharedParts {
    pub settings: Settings,
    pub apps: Apps,
    pub max_conns_effective: u64,
    pub memory_budget_source: &'static str,
    pub memory_budget_bytes: u64,
    pub outbound_budget_bytes: u64,
    pub inbound_budget_bytes: u64,
    pub shard_wakers: Vec<UnixStream>,
    pub coordinator: mpsc::SyncSender<()>,
    pub inboxes: Vec<async_channel::Sender<ShardMsg>>,
    pub tls: Option<Tls>,
    pub auth: Option<crate::auth::Auth>,
    pub fleet: Option<Arc<Fleet>>,
    pub access_log: Option<Arc<AccessLog>>,
    pub alarms: Arc<crate::alarms::AlarmIndex>,
    pub backup: Option<Arc<crate::backup::Backup>>,
}

/// One shard's side of the node for its connections' input accounts (`crate::inbound`).
pub(crate) struct ShardInbound {
    node: Arc<NodeShared>,
    shard: usize,
}

impl ShardInbound {
    pub fn new(node: Arc<NodeShared>, shard: usize) -> ShardInbound {
        ShardInbound { node, shard }
    }
}

impl crate::inbound::InboundShard for ShardInbound {
    fn stats(&self) -> &ShardStats {
        &self.node.stats[self.shard]
    }

    fn pool(&self) -> &Arc<crate::fair::Ledger> {
        &self.node.pools.inbound[self.shard]
    }

    fn budget(&self) -> u64 {
        self.node.inbound_budget_bytes
    }

    fn wake_coordinator(&self) {
        self.node.wake_coordinator();
    }
}

impl NodeShared {
    /// The shared state of a node about to start its shards.
    pub(crate) fn new(p: SharedParts) -> NodeShared {
        let addresses = Addresses::new(AddressLimits {
            max_conns: p.settings.max_conns_per_address,
            rate: p.settings.accept_rate_per_address,
        });
        let fleet_peers = Addresses::new(AddressLimits {
            max_conns: p.settings.max_conns_per_address,
            rate: u32::MAX,
        });
        let objects = ObjectCounts::count(
            &p.settings.data_dir,
            &p.apps,
            p.settings.max_objects_per_app,
        );
        let admission = Admission::default();
        let pools = Pools::new(
            PoolSizes {
                objects: p.settings.max_open_objects,
                answer_bytes: p.outbound_budget_bytes,
                handshakes: limits::TLS_HANDSHAKES_MAX as u64,
                creations: p
                    .settings
                    .object_create_rate
                    .saturating_mul(limits::OBJECT_CREATE_BURST_SECONDS),
                inbound_bytes: p.inbound_budget_bytes,
                presence: p.settings.presence_max,
                subscriptions: p.settings.subscriptions_max,
            },
            p.settings.shares(),
            p.inboxes.len(),
        );
        // The budget found at start-up, until the coordinator's first measurement.
        admission
            .memory_budget_bytes
            .store(p.memory_budget_bytes, Ordering::Relaxed);
        let users = Arc::new(crate::users::Users::new(p.settings.presence_max));
        NodeShared {
            users,
            objects,
            live: crate::live_objects::LiveObjects::new(p.inboxes.len()),
            stats: (0..p.inboxes.len())
                .map(|_| ShardStats::default())
                .collect(),
            settings: p.settings,
            apps: p.apps,
            max_conns_effective: p.max_conns_effective,
            admission,
            addresses,
            fleet_peers,
            memory_budget_source: p.memory_budget_source,
            outbound_budget_bytes: p.outbound_budget_bytes,
            inbound_budget_bytes: p.inbound_budget_bytes,
            started: Instant::now(),
            draining: AtomicBool::new(false),
            conns_open: Default::default(),
            shard_wakers: p.shard_wakers,
            coordinator: p.coordinator,
            missed: p.inboxes.iter().map(|_| Missed::default()).collect(),
            inboxes: p.inboxes,
            tls: p.tls,
            auth: p.auth,
            fleet: p.fleet,
            access_log: p.access_log,
            alarms: p.alarms,
            backup: p.backup,
            pools,
        }
    }

    /// Starts the drain: every shard is woken to see it.
    pub(crate) fn start_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
        self.wake_shards();
        self.wake_coordinator();
    }

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

    /// Takes a live object's place under `COMBD_MAX_OPEN_OBJECTS` (its descriptors are held
    /// back from the connection cap) for the client `asker`, within its share of them; given
    /// back when the share is dropped.
    pub(crate) fn reserve_object(&self, asker: ClientKey) -> Result<Share, PoolRefusal> {
        self.pools.objects.take(asker, 1)
    }

    /// Open public connections on every shard (what `COMBD_MAX_CONNS` caps).
    pub fn conns(&self) -> u64 {
        self.conns_of(ConnKind::Public)
    }

    /// Open connections of one kind on every shard.
    pub fn conns_of(&self, kind: ConnKind) -> u64 {
        self.conns_open[kind as usize].load(Ordering::Relaxed)
    }

    /// The cap on open connections of a kind: the public cap (`COMBD_MAX_CONNS` clamped), the
    /// localhost listener's own, and the fleet listener's, as large as the public one.
    pub fn conns_cap(&self, kind: ConnKind) -> u64 {
        match kind {
            ConnKind::Public | ConnKind::Fleet => self.max_conns_effective,
            ConnKind::Local => limits::LOCAL_CONNS_MAX,
        }
    }

    /// Reserves a connection of a kind; returns how many of it are open with it.
    pub(crate) fn reserve_conn(&self, kind: ConnKind) -> u64 {
        self.conns_open[kind as usize].fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Releases a connection reserved with [`NodeShared::reserve_conn`].
    pub(crate) fn release_conn(&self, kind: ConnKind) {
        self.conns_open[kind as usize].fetch_sub(1, Ordering::Relaxed);
    }

    /// The values the node derived at start-up that some limits show.
    pub fn in_force(&self) -> InForce {
        InForce {
            max_conns: self.max_conns_effective,
            memory_budget_bytes: self.admission.memory_budget_bytes.load(Ordering::Relaxed),
            outbound_budget_bytes: self.outbound_budget_bytes,
            inbound_budget_bytes: self.inbound_budget_bytes,
        }
    }

    /// Every limit in force, settings (from the settings table) and constants, for `/stats`.
    pub fn limits(&self) -> Vec<(&'static str, u64)> {
        let mut all = self.settings.limits(&self.in_force());
        all.extend(limits::FIXED.iter().map(|f| (f.name, f.value)));
        all
    }

    /// Every app's name and, for one deployed as a module, its version in force.
    fn deployments(&self) -> Vec<(&'static str, Option<stats::Deployment>)> {
        let app = |n| self.apps.get(n).and_then(|a| a.deployment());
        self.apps.names().into_iter().map(|n| (n, app(n))).collect()
    }

    /// The node-wide figures of `/stats`.
    pub fn figures(&self) -> NodeFigures {
        let a = &self.admission;
        NodeFigures {
            uptime_ms: self.started.elapsed().as_millis() as u64,
            max_conns_effective: self.max_conns_effective,
            draining: self.draining() as u64,
            memory_budget_source: self.memory_budget_source,
            full_reason: a.full_reason(),
            limits: self.limits(),
            apps: self.deployments(),
            objects: self
                .apps
                .names()
                .into_iter()
                .map(|a| (a, self.objects.get(a)))
                .collect(),
            figures: self.admission_figures(),
        }
    }

    /// The admission state's figures: refusing, memory, disk, measurements, TLS reloads.
    #[rustfmt::skip]
    fn admission_figures(&self) -> Vec<Field> {
        use Kind::*;
        let a = &self.admission;
        let g = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
        let mut figures = vec![
            ("tcp_refusing", "combd_tcp_refusing", Gauge, "1 while the node refuses new connections at TCP.", a.refusing() as u64),
            ("pressure", "combd_pressure", Gauge, "Memory pressure level, 0, 1 or 2.", a.pressure.load(Ordering::Relaxed) as u64),
            ("memory_own_bytes", "combd_memory_own_bytes", Gauge, "Memory the node counts as its own.", g(&a.memory_own_bytes)),
            ("memory_rss_bytes", "combd_memory_rss_bytes", Gauge, "Resident set of the process.", g(&a.memory_rss_bytes)),
            ("memory_own_percent", "combd_memory_own_percent", Gauge, "Own memory as a percentage of the budget.", g(&a.memory_own_percent)),
            ("memory_budget_bytes", "combd_memory_budget_bytes", Gauge, "The memory budget.", g(&a.memory_budget_bytes)),
            ("machine_total_bytes", "combd_machine_total_bytes", Gauge, "The machine's memory (MemTotal).", g(&a.machine_total_bytes)),
            ("machine_available_bytes", "combd_machine_available_bytes", Gauge, "The machine's available memory (MemAvailable).", g(&a.machine_available_bytes)),
            ("machine_percent", "combd_machine_percent", Gauge, "Machine memory used, as a percentage of the machine less a tenth.", g(&a.machine_percent)),
            ("tcp_kernel_bytes", "combd_tcp_kernel_bytes", Gauge, "Kernel TCP buffer memory, machine-wide.", g(&a.tcp_kernel_bytes)),
            ("listen_stops", "combd_listen_stops_total", Counter, "Times the node stopped listening.", g(&a.listen_stops)),
            ("addresses", "combd_addresses", Gauge, "Client addresses with public connections open (or an accept-rate bucket refilling).", self.addresses.tracked() as u64),
            ("address_conns_most", "combd_address_conns_most", Gauge, "The most public connections one client address holds now.", u64::from(self.addresses.most_open())),
            ("objects_open", "combd_objects_open", Gauge, "Live objects on every shard (COMBD_MAX_OPEN_OBJECTS caps them).", g(&self.pools.objects.figures().held)),
            ("objects_open_max", "combd_objects_open_max", Gauge, "The most live objects at once.", g(&self.pools.objects.figures().held_max)),
            ("conns_public", "combd_conns_public", Gauge, "Open public connections (what COMBD_MAX_CONNS caps).", self.conns_of(ConnKind::Public)),
            ("conns_local", "combd_conns_local", Gauge, "Open connections of the node's own machine on the localhost listener.", self.conns_of(ConnKind::Local)),
            ("conns_fleet", "combd_conns_fleet", Gauge, "Open connections from other nodes on the fleet listener.", self.conns_of(ConnKind::Fleet)),
            ("disk_low", "combd_disk_low", Gauge, "1 while the data disk is low.", a.disk_low() as u64),
            ("disk_free_bytes", "combd_disk_free_bytes", Gauge, "Free bytes on the data disk.", g(&a.disk_free_bytes)),
            ("measurements", "combd_measurements_total", Counter, "Admission measurements taken.", g(&a.measurements)),
            ("tls_reloads", "combd_tls_reloads_total", Counter, "TLS certificate reloads that took effect.", self.tls.as_ref().map_or(0, |t| g(&t.reloads))),
            ("tls_reload_failures", "combd_tls_reload_failures_total", Counter, "TLS certificate reloads refused.", self.tls.as_ref().map_or(0, |t| g(&t.reload_failures))),
            ("auth_key_reloads", "combd_auth_key_reloads_total", Counter, "Token key reloads (SIGHUP) that took effect.", self.auth.as_ref().map_or(0, |a| g(&a.reloads))),
            ("auth_key_reload_failures", "combd_auth_key_reload_failures_total", Counter, "Token key reloads refused (the old key kept).", self.auth.as_ref().map_or(0, |a| g(&a.reload_failures))),
            ("wasm_reloads", "combd_wasm_reloads_total", Counter, "Module reloads that replaced an app's version.", self.deployments().iter().filter_map(|(_, d)| d.as_ref()).map(|d| d.reloads).sum()),
            ("wasm_reloads_refused", "combd_wasm_reloads_refused_total", Counter, "Module reloads refused (the old version kept).", self.deployments().iter().filter_map(|(_, d)| d.as_ref()).map(|d| d.reloads_refused).sum()),
            ("wasm_apps_added", "combd_wasm_apps_added_total", Counter, "Modules deployed by a reload (a new file in the apps directory).", self.apps.changes().added),
            ("wasm_apps_removed", "combd_wasm_apps_removed_total", Counter, "Modules removed by a reload (their file gone).", self.apps.changes().removed),
            ("wasm_apps_add_refused", "combd_wasm_apps_add_refused_total", Counter, "New modules a reload refused to deploy.", self.apps.changes().add_refused),
        ];
        figures.extend(crate::auth::Auth::figures(self.auth.as_ref()));
        let log = self.access_log.as_deref();
        figures.push(("access_log_write_errors", "combd_access_log_write_errors_total", Counter, "Access-log writes that failed (their lines lost).", log.map_or(0, |l| g(&l.write_errors))));
        figures.push(("access_log_reopens", "combd_access_log_reopens_total", Counter, "Times SIGHUP opened the access log's file again.", log.map_or(0, |l| g(&l.reopens))));
        figures.push(("access_log_chunks_waiting", "combd_access_log_chunks_waiting", Gauge, "Access-log chunks waiting for the writer, every shard together.", log.map_or(0, |l| l.waiting())));
        figures.push(("access_log_chunks_waiting_max", "combd_access_log_chunks_waiting_max", Gauge, "The most access-log chunks one shard had waiting for the writer.", log.map_or(0, |l| g(&l.waiting_max))));
        let (pending, objects) = self.alarms.pending();
        figures.push(("alarms_pending", "combd_alarms_pending", Gauge, "Alarms pending, as the alarm index knows them (each object's count as its last call or wake left it).", pending));
        figures.push(("alarm_objects", "combd_alarm_objects", Gauge, "Objects with alarms pending in the alarm index.", objects));
        figures.extend(self.pools.figures());
        figures.extend(Fleet::figures(self.fleet.as_deref()));
        figures.extend(crate::backup::Backup::figures(self.backup.as_deref()));
        figures
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
