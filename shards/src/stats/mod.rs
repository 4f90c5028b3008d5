//! Per-shard counters and gauges, and their two renderings: `/stats` (JSON) and `/metrics`
//! (Prometheus text).
//!
//! Each shard owns one [`ShardStats`] and is its only writer (relaxed atomic adds on its own
//! cache line); any shard's localhost listener may read all of them to answer `/stats`. Every
//! field is declared once in [`ShardStats::fields`], which both renderings walk, so JSON and
//! metrics cannot disagree.

use std::sync::atomic::{AtomicU64, Ordering};

mod render;
pub(crate) mod stages;
pub use render::{render_json, render_metrics, Deployment, NodeFigures};
pub use stages::{Stage, StageTimes};

/// Whether a figure goes up and down (a gauge) or only up (a counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A current value.
    Gauge,
    /// A running total since start.
    Counter,
}

/// One shard's figures. Padded to its own cache lines so shards never share one.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct ShardStats {
    /// Open connections (HTTP and WebSocket).
    pub conns: AtomicU64,
    /// Connections accepted since start.
    pub accepted: AtomicU64,
    /// Failed accept calls (other than the listener being stopped).
    pub accept_errors: AtomicU64,
    /// HTTP requests answered (including errors and WebSocket upgrades).
    pub requests: AtomicU64,
    /// Responses with a 4xx status.
    pub responses_4xx: AtomicU64,
    /// Responses with a 5xx status.
    pub responses_5xx: AtomicU64,
    /// Open WebSockets.
    pub ws_open: AtomicU64,
    /// WebSocket messages received (after reassembly).
    pub ws_messages_in: AtomicU64,
    /// WebSocket messages sent.
    pub ws_messages_out: AtomicU64,
    /// Writes of WebSocket output to a socket: one write carries every frame waiting, so
    /// `ws_messages_out / ws_sends` is how many frames a send coalesced.
    pub ws_sends: AtomicU64,
    /// Of `ws_sends`, those the fan-out wrote itself (the connection waiting to read).
    pub ws_direct_sends: AtomicU64,
    /// Writes of the fan-out the kernel took part of a frame of (the connection writes the
    /// rest).
    pub ws_direct_cut: AtomicU64,
    /// WebSockets opened with permessage-deflate negotiated.
    pub ws_deflate_opened: AtomicU64,
    /// Compressed messages received and decompressed.
    pub ws_inflated_in: AtomicU64,
    /// Messages sent compressed (a broadcast counts once per session it went to).
    pub ws_deflated_out: AtomicU64,
    /// WebSockets the node closed for a protocol error (1002), bad UTF-8 (1007) or size (1009).
    pub ws_protocol_closed: AtomicU64,
    /// Bytes read from clients.
    pub bytes_in: AtomicU64,
    /// Bytes written to clients.
    pub bytes_out: AtomicU64,
    /// Requests closed with 408 because the head or body did not arrive in time.
    pub request_timeouts: AtomicU64,
    /// Keep-alive connections closed after `COMBD_IDLE_TIMEOUT` without a request.
    pub idle_closed: AtomicU64,
    /// Connections that got in while the node was full (or past the connection cap) and were
    /// answered 503 (plain HTTP) or closed (TLS).
    pub refused_late: AtomicU64,
    /// Public connections closed at once after the accept: their address held
    /// `COMBD_MAX_CONNS_PER_ADDRESS` already.
    pub address_conns_refused: AtomicU64,
    /// Public connections closed at once after the accept: their address opened them faster
    /// than `COMBD_ACCEPT_RATE_PER_ADDRESS` past its burst.
    pub address_rate_refused: AtomicU64,
    /// WebSocket upgrades and state-changing requests refused 403 for their `Origin`
    /// (`COMBD_ALLOWED_ORIGINS`).
    pub origin_refused: AtomicU64,
    /// Requests and WebSocket upgrades to an identified app refused 401: no token, or one that
    /// failed (`COMBD_AUTH_JWT_KEY_FILE`).
    pub auth_refused: AtomicU64,
    /// Sessions closed (3000) because their client's token expired.
    pub auth_expired_closed: AtomicU64,
    /// Tokens verified (a client named).
    pub auth_verified: AtomicU64,
    /// Connections of the node's own machine closed at once: the localhost listener held
    /// `LOCAL_CONNS_MAX` already.
    pub local_conns_refused: AtomicU64,
    /// Connections from other nodes closed at once: the fleet listener held its cap already.
    pub fleet_conns_refused: AtomicU64,
    /// 1 while this shard's public listener listens.
    pub listening: AtomicU64,
    /// 1 while this shard is behind (its ready line as long as its awake cap).
    pub behind: AtomicU64,
    /// How late this shard's last housekeeping tick ran, in milliseconds.
    pub lag_ms: AtomicU64,
    /// When this shard's housekeeping tick last ran, in milliseconds since the node started:
    /// the heartbeat the watchdog checks.
    pub heartbeat_ms: AtomicU64,
    /// Cells at work now (holding an awake slot).
    pub cells_awake: AtomicU64,
    /// The most cells at work at once.
    pub cells_awake_max: AtomicU64,
    /// Cells with work waiting for an awake slot now (the ready line).
    pub sessions_ready: AtomicU64,
    /// Cells that had to wait for an awake slot, in all.
    pub sessions_waited: AtomicU64,
    /// Open sessions.
    pub sessions: AtomicU64,
    /// Live objects on this shard.
    pub objects_live: AtomicU64,
    /// New objects refused because the node had `COMBD_MAX_OPEN_OBJECTS` live.
    pub objects_open_refused: AtomicU64,
    /// Objects being opened now.
    pub restores_active: AtomicU64,
    /// Objects waiting for a restore slot now.
    pub restores_waiting: AtomicU64,
    /// In a fleet, reads of an object's owner on their way now (`cells::route`).
    pub fleet_lookups_waiting: AtomicU64,
    /// The most of them on their way at once (at most `fleet_lookups_max`).
    pub fleet_lookups_waiting_max: AtomicU64,
    /// Requests sent to an object cell with no read of the owner, because `fleet_lookups_max`
    /// reads were on their way.
    pub fleet_lookups_overflowed: AtomicU64,
    /// Objects opened, in all.
    pub restores: AtomicU64,
    /// Object databases created (a write to an object that had none).
    pub objects_created: AtomicU64,
    /// Writes to new objects refused past `COMBD_MAX_OBJECTS_PER_APP`.
    pub objects_refused_count: AtomicU64,
    /// Writes to new objects refused past `COMBD_OBJECT_CREATE_RATE`.
    pub objects_refused_rate: AtomicU64,
    /// The most objects opened at once.
    pub restores_active_max: AtomicU64,
    /// Blocking threads' slots held now (a job running or handed to a thread).
    pub blocking_busy: AtomicU64,
    /// The most held at once.
    pub blocking_busy_max: AtomicU64,
    /// Jobs waiting for a blocking thread's slot now.
    pub blocking_waiting: AtomicU64,
    /// Jobs that waited for one, in all.
    pub blocking_waited: AtomicU64,
    /// Jobs that waited while a slot was free, their client holding its
    /// `blocking_threads_per_client`.
    pub blocking_waited_share: AtomicU64,
    /// The most blocking threads one client may hold now (its share).
    pub blocking_client_share: AtomicU64,
    /// Inputs refused because an object's mailbox (or the shard's inbox) was full.
    pub mailbox_refused: AtomicU64,
    /// Messages dropped for a session (its mailbox full, or its shard behind, or another shard
    /// could not reach it); each drop makes the session resync.
    pub session_mailbox_dropped: AtomicU64,
    /// Sessions resynced because their client's sessions on the shard held its share of the
    /// outbound budget (`COMBD_CLIENT_SHARE_MAX_PERCENT`).
    pub session_share_resyncs: AtomicU64,
    /// Deliveries and broadcasts dropped because another shard's inbox was full.
    pub cross_shard_dropped: AtomicU64,
    /// Sends to a session of another life of the node, dropped (an id kept from before a
    /// restart names no session of this one).
    pub sends_to_other_lives: AtomicU64,
    /// Alarms fired (their handler committed).
    pub alarms_fired: AtomicU64,
    /// Alarm handlers that failed (rolled back; the alarm fires again after a backoff).
    pub alarms_failed: AtomicU64,
    /// The latest an alarm fired, in milliseconds past its time.
    pub alarm_late_ms_max: AtomicU64,
    /// Objects woken for their due alarms.
    pub alarm_wakes: AtomicU64,
    /// Wakes refused or unanswered (the object is woken again later).
    pub alarm_wakes_refused: AtomicU64,
    /// Synced commits of the shard's alarm index (one for every lower of the shard waiting by
    /// then; none for an alarm later than what its object's entry already says), as of the
    /// shard's last housekeeping tick.
    pub alarm_index_syncs: AtomicU64,
    /// Messages between objects sent (each delivery, a resend included).
    pub object_messages_sent: AtomicU64,
    /// Messages between objects taken by their receiver (each exactly once).
    pub object_messages_taken: AtomicU64,
    /// Messages between objects delivered again and recognised as taken before.
    pub object_messages_taken_again: AtomicU64,
    /// Batches run (one transaction each, or one input).
    pub batches: AtomicU64,
    /// The largest batch.
    pub batch_max: AtomicU64,
    /// WAL syncs made before answering committed batches (`COMBD_SQLITE_SYNC=full`).
    pub wal_syncs: AtomicU64,
    /// The most committed batches that shared one WAL sync.
    pub sync_group_max: AtomicU64,
    /// The longest WAL sync, in microseconds (its wait on a blocking thread included).
    pub wal_sync_max_us: AtomicU64,
    /// WAL syncs that took longer than 10 ms (`WAL_SYNC_SLOW`).
    pub wal_syncs_slow: AtomicU64,
    /// Inputs that committed but were answered 500 because their WAL sync (or an earlier
    /// one) failed.
    pub wal_sync_failed_inputs: AtomicU64,
    /// The oldest age an input reached waiting in a mailbox, in milliseconds.
    pub mailbox_oldest_age_ms: AtomicU64,
    /// Calls that took longer than 10 ms.
    pub slow_calls: AtomicU64,
    /// Broadcasts numbered and kept in their topic's log (`cells::topic_log`).
    pub topic_log_frames: AtomicU64,
    /// Frames trimmed from topics' logs past their retention.
    pub topic_log_trimmed: AtomicU64,
    /// Numbered sessions' attaches refused (503) past their batch's replay budget.
    pub topic_log_resumes_refused: AtomicU64,
    /// Calls killed past `COMBD_CPU_LIMIT_TICKS`.
    pub cpu_limit_killed: AtomicU64,
    /// Calls killed past 1 s of host calls.
    pub host_time_killed: AtomicU64,
    /// SQL statements interrupted past 100 ms.
    pub sql_timeouts: AtomicU64,
    /// SQL values refused past 2 MB.
    pub sql_too_big: AtomicU64,
    /// Writes refused at the 1 GB database cap.
    pub db_full: AtomicU64,
    /// Sends refused past 16 MiB a request.
    pub send_limit_refused: AtomicU64,
    /// Sends an object addressed to a session of another object, dropped.
    pub sends_foreign_dropped: AtomicU64,
    /// Calls failed because their SQL ran a statement the node does not allow apps.
    pub sql_denied: AtomicU64,
    /// Objects reloaded from their database after a killed call.
    pub reloads: AtomicU64,
    /// Calls killed past their app's `memory_kb`.
    pub memory_limit_killed: AtomicU64,
    /// WebSockets closed because 8 MiB was waiting for them.
    pub ws_slow_closed: AtomicU64,
    /// Connections closed because the shard's outbound budget was spent.
    pub outbound_budget_closed: AtomicU64,
    /// Sessions closed (1001) because their app was removed by a reload.
    pub ws_app_removed_closed: AtomicU64,
    /// Sessions closed because this node's fleet lease was lost (their objects may be another
    /// node's now).
    pub ws_lease_lost_closed: AtomicU64,
    /// Sessions closed (4404) because their object was deleted.
    pub ws_object_deleted_closed: AtomicU64,
    /// Sessions closed (1012) because their object was replaced by a restore.
    pub ws_object_restored_closed: AtomicU64,
    /// Objects restored from the backup (in place, or a fork into a new name).
    pub objects_restored: AtomicU64,
    /// Objects deleted because their app lets them expire and they went unwritten longer.
    pub objects_expired: AtomicU64,
    /// Objects past their app's expiry kept when their task looked: written since, or with
    /// alarms or messages pending.
    pub objects_expiry_kept: AtomicU64,
    /// Objects brought to their app's version as they opened (`cells::migrate`).
    pub objects_migrated: AtomicU64,
    /// Opens refused because a migration step failed (the object stays as it was).
    pub objects_migration_failed: AtomicU64,
    /// Objects deleted on this shard (their home): by `cx.delete()`, by the operator, or
    /// finished as they opened after a crash.
    pub objects_deleted: AtomicU64,
    /// Bytes waiting to be written on this shard (session mailboxes and writes in progress).
    pub outbound_bytes: AtomicU64,
    /// The most bytes waiting at once.
    pub outbound_bytes_max: AtomicU64,
    /// Times a connection held `PIPELINE_HELD_MAX_BYTES` of responses and wrote them (waiting
    /// for its client to take them) before answering more.
    pub pipeline_held_waits: AtomicU64,
    /// Times a slow request's connection paused its reading for `SLOW_READ_INTERVAL`.
    pub slow_reads_paced: AtomicU64,
    /// The most bytes of responses one connection held at once: answered and not yet written,
    /// or kept behind an object's answer still owed (bounded by `PIPELINE_HELD_MAX_BYTES` and
    /// the response that crossed it).
    pub pipeline_held_bytes_max: AtomicU64,
    /// Bytes of clients' input waiting in this shard's connections' jobs (mailboxes, inboxes,
    /// batches running), against `COMBD_INBOUND_BUDGET`.
    pub inbound_bytes: AtomicU64,
    /// The most inbound bytes held at once.
    pub inbound_bytes_max: AtomicU64,
    /// The sixteenth of the inbound budget the shard's input last woke the coordinator at
    /// (not shown: it keeps a hold taken again at the same level from waking it again).
    pub inbound_wake_level: AtomicU64,
    /// Inputs refused because the shard's inbound budget was spent.
    pub inbound_refused: AtomicU64,
    /// Times a connection stopped being read because `INBOUND_CONN_QUEUED_MAX_BYTES` of its
    /// input waited.
    pub inbound_waits: AtomicU64,
    /// WebSockets closed with 1008 past their message rate.
    pub ws_rate_closed: AtomicU64,
    /// WebSockets closed with 1009 for a compressed message past `WS_INFLATE_RATIO_MAX` times
    /// its compressed size.
    pub ws_inflate_ratio_closed: AtomicU64,
    /// WebSockets closed with 1008 past `COMBD_WS_INFLATE_RATE` decompressed bytes a second.
    pub ws_inflate_rate_closed: AtomicU64,
    /// WebSockets closed because they did not answer a ping by the next one.
    pub ws_ping_timeouts: AtomicU64,
    /// TLS handshakes completed.
    pub tls_handshakes: AtomicU64,
    /// TLS handshakes that failed or timed out.
    pub tls_handshake_failures: AtomicU64,
    /// TLS handshakes in progress now (ClientHello in, handshake not done: each holds a slot).
    pub tls_handshakes_in_progress: AtomicU64,
    /// TLS connections closed at once because their ClientHello came in while too many
    /// handshakes were in progress.
    pub tls_handshakes_refused: AtomicU64,
    /// TLS connections closed because their ClientHello was not in by `COMBD_TLS_HELLO_TIMEOUT`
    /// (they held no handshake slot meanwhile).
    pub tls_hello_timeouts: AtomicU64,
    /// Times a loop that grows with load (fan-out, inbox, ping sweep, accept-queue drain)
    /// spent its budget for one turn and yielded the shard's loop to the other tasks.
    pub turn_yields: AtomicU64,
    /// Turns of the shard's loop that ran longer than `TURN_OVERRUN`: a budgeted loop's turn,
    /// or any task that held the loop (seen by the housekeeping timer firing late).
    pub turn_overruns: AtomicU64,
    /// Broadcasts being fanned out to this shard's sessions now.
    pub fanouts_in_progress: AtomicU64,
    /// Sessions that missed messages and were resynced (attached again, or closed with 1013).
    pub session_resyncs: AtomicU64,
    /// Numbered sessions that missed messages and resumed from their topic's log in place.
    pub session_resumes: AtomicU64,
    /// Changes of a topic's presence sent to its numbered sessions (one a topic a batch).
    pub presence_changes: AtomicU64,
    /// Sessions attached to a topic that keeps presence but not listed in it (the topic's or
    /// the node's members full, or their client at its share).
    pub presence_unlisted: AtomicU64,
    /// Subscriptions of multiplexed WebSockets (`/ws`) open now.
    pub ws_subscriptions: AtomicU64,
    /// Subscribes refused, whatever the reason (the socket's bound, the node's pool, the app or
    /// its object, the owner in a fleet).
    pub ws_subscriptions_refused: AtomicU64,
    /// Access-log lines queued for the writer.
    pub access_log_lines: AtomicU64,
    /// Access-log lines dropped: every chunk of the shard was waiting for the writer.
    pub access_log_dropped: AtomicU64,
    /// Warnings about apps' failed calls not logged past `APP_ERROR_LOGS_PER_WINDOW`.
    pub app_errors_log_suppressed: AtomicU64,
    /// How long inputs spend in each stage of their object's pipeline (`"stages"`).
    pub stages: StageTimes,
}

/// One figure: its `/stats` name, `/metrics` name, kind, help line and value.
pub type Field = (&'static str, &'static str, Kind, &'static str, u64);

impl ShardStats {
    /// Adds `n` to a figure.
    #[inline]
    pub fn add(field: &AtomicU64, n: u64) {
        field.fetch_add(n, Ordering::Relaxed);
    }

    /// Subtracts `n` from a gauge.
    #[inline]
    pub fn sub(field: &AtomicU64, n: u64) {
        field.fetch_sub(n, Ordering::Relaxed);
    }

    /// Every figure, in a fixed order.
    pub fn fields(&self) -> Vec<Field> {
        let mut all = self.connection_fields();
        all.extend(self.cell_fields());
        all.extend(self.limit_fields());
        all
    }

    /// The connections' figures: accepted, requests, WebSockets, bytes, refusals, admission.
    #[rustfmt::skip]
    fn connection_fields(&self) -> Vec<Field> {
        use Kind::*;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("conns", "combd_conns", Gauge, "Open connections.", g(&self.conns)),
            ("accepted", "combd_accepted_total", Counter, "Connections accepted.", g(&self.accepted)),
            ("accept_errors", "combd_accept_errors_total", Counter, "Failed accept calls.", g(&self.accept_errors)),
            ("requests", "combd_requests_total", Counter, "HTTP requests answered.", g(&self.requests)),
            ("responses_4xx", "combd_responses_4xx_total", Counter, "Responses with a 4xx status.", g(&self.responses_4xx)),
            ("responses_5xx", "combd_responses_5xx_total", Counter, "Responses with a 5xx status.", g(&self.responses_5xx)),
            ("ws_open", "combd_ws_open", Gauge, "Open WebSockets.", g(&self.ws_open)),
            ("ws_messages_in", "combd_ws_messages_in_total", Counter, "WebSocket messages received.", g(&self.ws_messages_in)),
            ("ws_messages_out", "combd_ws_messages_out_total", Counter, "WebSocket messages sent.", g(&self.ws_messages_out)),
            ("ws_sends", "combd_ws_sends_total", Counter, "Writes of WebSocket output to a socket (each carries every frame waiting).", g(&self.ws_sends)),
            ("ws_direct_sends", "combd_ws_direct_sends_total", Counter, "Writes of WebSocket output made by the fan-out itself.", g(&self.ws_direct_sends)),
            ("ws_direct_cut", "combd_ws_direct_cut_total", Counter, "Fan-out writes that sent part of a frame (the connection wrote the rest).", g(&self.ws_direct_cut)),
            ("ws_deflate_opened", "combd_ws_deflate_opened_total", Counter, "WebSockets opened with permessage-deflate.", g(&self.ws_deflate_opened)),
            ("ws_inflated_in", "combd_ws_inflated_in_total", Counter, "Compressed WebSocket messages received.", g(&self.ws_inflated_in)),
            ("ws_deflated_out", "combd_ws_deflated_out_total", Counter, "WebSocket messages sent compressed.", g(&self.ws_deflated_out)),
            ("ws_protocol_closed", "combd_ws_protocol_closed_total", Counter, "WebSockets closed for a protocol, UTF-8 or size error.", g(&self.ws_protocol_closed)),
            ("bytes_in", "combd_received_bytes_total", Counter, "Bytes read from clients.", g(&self.bytes_in)),
            ("bytes_out", "combd_sent_bytes_total", Counter, "Bytes written to clients.", g(&self.bytes_out)),
            ("request_timeouts", "combd_request_timeouts_total", Counter, "Requests answered 408 for a slow head or body.", g(&self.request_timeouts)),
            ("idle_closed", "combd_idle_closed_total", Counter, "Keep-alive connections closed when idle.", g(&self.idle_closed)),
            ("refused_late", "combd_refused_late_total", Counter, "Connections answered 503 or closed because the node was full.", g(&self.refused_late)),
            ("address_conns_refused", "combd_address_conns_refused_total", Counter, "Connections closed at once: their address was at COMBD_MAX_CONNS_PER_ADDRESS.", g(&self.address_conns_refused)),
            ("address_rate_refused", "combd_address_rate_refused_total", Counter, "Connections closed at once: their address opened them faster than COMBD_ACCEPT_RATE_PER_ADDRESS.", g(&self.address_rate_refused)),
            ("origin_refused", "combd_origin_refused_total", Counter, "WebSocket upgrades and state-changing requests refused 403 for their Origin (COMBD_ALLOWED_ORIGINS).", g(&self.origin_refused)),
            ("auth_refused", "combd_auth_refused_total", Counter, "Requests and upgrades to an identified app refused 401 (no token, or one that failed).", g(&self.auth_refused)),
            ("auth_expired_closed", "combd_auth_expired_closed_total", Counter, "Sessions closed 3000 because their token expired.", g(&self.auth_expired_closed)),
            ("auth_verified", "combd_auth_verified_total", Counter, "Tokens verified.", g(&self.auth_verified)),
            ("local_conns_refused", "combd_local_conns_refused_total", Counter, "Localhost connections closed at once past the localhost listener's cap.", g(&self.local_conns_refused)),
            ("fleet_conns_refused", "combd_fleet_conns_refused_total", Counter, "Fleet connections closed at once past the fleet listener's cap.", g(&self.fleet_conns_refused)),
            ("listening", "combd_listening", Gauge, "1 while the public listener listens.", g(&self.listening)),
            ("behind", "combd_behind", Gauge, "1 while the shard is behind.", g(&self.behind)),
            ("lag_ms", "combd_lag_milliseconds", Gauge, "How late the last housekeeping tick ran.", g(&self.lag_ms)),
        ]
    }

    /// The cells' figures: awake, sessions, objects and their restores, mailboxes, alarms, batches, the WAL.
    #[rustfmt::skip]
    fn cell_fields(&self) -> Vec<Field> {
        use Kind::*;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("cells_awake", "combd_cells_awake", Gauge, "Cells at work now.", g(&self.cells_awake)),
            ("cells_awake_max", "combd_cells_awake_max", Gauge, "The most cells at work at once.", g(&self.cells_awake_max)),
            ("sessions_ready", "combd_sessions_ready", Gauge, "Cells waiting for an awake slot now.", g(&self.sessions_ready)),
            ("sessions_waited", "combd_sessions_waited_total", Counter, "Cells that waited for an awake slot.", g(&self.sessions_waited)),
            ("sessions", "combd_sessions", Gauge, "Open sessions.", g(&self.sessions)),
            ("objects_live", "combd_objects_live", Gauge, "Live objects.", g(&self.objects_live)),
            ("objects_open_refused", "combd_objects_open_refused_total", Counter, "New objects refused at COMBD_MAX_OPEN_OBJECTS.", g(&self.objects_open_refused)),
            ("restores_active", "combd_restores_active", Gauge, "Objects being opened now.", g(&self.restores_active)),
            ("restores_waiting", "combd_restores_waiting", Gauge, "Objects waiting to be opened.", g(&self.restores_waiting)),
            ("fleet_lookups_waiting", "combd_fleet_lookups_waiting", Gauge, "Reads of an object's owner on their way now.", g(&self.fleet_lookups_waiting)),
            ("fleet_lookups_waiting_max", "combd_fleet_lookups_waiting_max", Gauge, "The most reads of an owner on their way at once.", g(&self.fleet_lookups_waiting_max)),
            ("fleet_lookups_overflowed", "combd_fleet_lookups_overflowed_total", Counter, "Requests sent to a cell unread because fleet_lookups_max reads were on their way.", g(&self.fleet_lookups_overflowed)),
            ("restores", "combd_restores_total", Counter, "Objects opened.", g(&self.restores)),
            ("objects_created", "combd_objects_created_total", Counter, "Object databases created.", g(&self.objects_created)),
            ("objects_refused_count", "combd_objects_refused_count_total", Counter, "Writes to new objects refused past the objects per app.", g(&self.objects_refused_count)),
            ("objects_refused_rate", "combd_objects_refused_rate_total", Counter, "Writes to new objects refused past the creation rate.", g(&self.objects_refused_rate)),
            ("restores_active_max", "combd_restores_active_max", Gauge, "The most objects opened at once.", g(&self.restores_active_max)),
            ("blocking_busy", "combd_blocking_busy", Gauge, "Blocking threads' slots held now.", g(&self.blocking_busy)),
            ("blocking_busy_max", "combd_blocking_busy_max", Gauge, "The most blocking threads' slots held at once.", g(&self.blocking_busy_max)),
            ("blocking_waiting", "combd_blocking_waiting", Gauge, "Jobs waiting for a blocking thread now.", g(&self.blocking_waiting)),
            ("blocking_waited", "combd_blocking_waited_total", Counter, "Jobs that waited for a blocking thread.", g(&self.blocking_waited)),
            ("blocking_client_share", "combd_blocking_client_share", Gauge, "The most blocking threads one client may hold now.", g(&self.blocking_client_share)),
            ("blocking_waited_share", "combd_blocking_waited_share_total", Counter, "Jobs that waited while a blocking thread was free, their client holding blocking_threads_per_client.", g(&self.blocking_waited_share)),
            ("mailbox_refused", "combd_mailbox_refused_total", Counter, "Inputs refused at a full mailbox.", g(&self.mailbox_refused)),
            ("session_mailbox_dropped", "combd_session_mailbox_dropped_total", Counter, "Messages dropped at a full session mailbox.", g(&self.session_mailbox_dropped)),
            ("session_share_resyncs", "combd_session_share_resyncs_total", Counter, "Sessions resynced because their client's sessions held its share of the outbound budget.", g(&self.session_share_resyncs)),
            ("cross_shard_dropped", "combd_cross_shard_dropped_total", Counter, "Deliveries dropped at a full shard inbox.", g(&self.cross_shard_dropped)),
            ("sends_to_other_lives", "combd_sends_to_other_lives_total", Counter, "Sends to a session id of another life of the node, dropped.", g(&self.sends_to_other_lives)),
            ("alarms_fired", "combd_alarms_fired_total", Counter, "Alarms fired (their handler committed).", g(&self.alarms_fired)),
            ("alarms_failed", "combd_alarms_failed_total", Counter, "Alarm handlers that failed (the alarm fires again after a backoff).", g(&self.alarms_failed)),
            ("alarm_late_ms_max", "combd_alarm_late_ms_max", Gauge, "The latest an alarm fired past its time, in milliseconds.", g(&self.alarm_late_ms_max)),
            ("alarm_wakes", "combd_alarm_wakes_total", Counter, "Objects woken for their due alarms.", g(&self.alarm_wakes)),
            ("alarm_wakes_refused", "combd_alarm_wakes_refused_total", Counter, "Wakes refused or unanswered; the object is woken again after alarm_wake_retry_ms.", g(&self.alarm_wakes_refused)),
            ("alarm_index_syncs", "combd_alarm_index_syncs_total", Counter, "Synced commits of the shard's alarm index (a group of lowers shares one), as of its last tick.", g(&self.alarm_index_syncs)),
            ("object_messages_sent", "combd_object_messages_sent_total", Counter, "Messages between objects sent (a resend counted again).", g(&self.object_messages_sent)),
            ("object_messages_taken", "combd_object_messages_taken_total", Counter, "Messages between objects taken by their receiver, each once.", g(&self.object_messages_taken)),
            ("object_messages_taken_again", "combd_object_messages_taken_again_total", Counter, "Messages between objects delivered again and recognised as taken before.", g(&self.object_messages_taken_again)),
            ("batches", "combd_batches_total", Counter, "Batches run.", g(&self.batches)),
            ("batch_max", "combd_batch_max", Gauge, "The largest batch.", g(&self.batch_max)),
            ("wal_syncs", "combd_wal_syncs_total", Counter, "WAL syncs made before answering.", g(&self.wal_syncs)),
            ("sync_group_max", "combd_sync_group_max", Gauge, "The most batches that shared one WAL sync.", g(&self.sync_group_max)),
            ("wal_sync_max_us", "combd_wal_sync_max_microseconds", Gauge, "The longest WAL sync.", g(&self.wal_sync_max_us)),
            ("wal_syncs_slow", "combd_wal_syncs_slow_total", Counter, "WAL syncs over 10 ms.", g(&self.wal_syncs_slow)),
            ("wal_sync_failed_inputs", "combd_wal_sync_failed_inputs_total", Counter, "Inputs answered 500 because their WAL sync failed.", g(&self.wal_sync_failed_inputs)),
            ("mailbox_oldest_age_ms", "combd_mailbox_oldest_age_milliseconds", Gauge, "The oldest a waiting input got.", g(&self.mailbox_oldest_age_ms)),
        ]
    }

    /// The limits' figures: calls cut, budgets, TLS handshakes, the loop's turns, the logs.
    #[rustfmt::skip]
    fn limit_fields(&self) -> Vec<Field> {
        use Kind::*;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("slow_calls", "combd_slow_calls_total", Counter, "Calls longer than 10 ms.", g(&self.slow_calls)),
            ("topic_log_frames", "combd_topic_log_frames_total", Counter, "Broadcasts numbered and kept in their topic's log.", g(&self.topic_log_frames)),
            ("topic_log_trimmed", "combd_topic_log_trimmed_total", Counter, "Frames trimmed from topics' logs past their retention.", g(&self.topic_log_trimmed)),
            ("topic_log_resumes_refused", "combd_topic_log_resumes_refused_total", Counter, "Numbered sessions' attaches refused past their batch's replay budget.", g(&self.topic_log_resumes_refused)),
            ("cpu_limit_killed", "combd_cpu_limit_killed_total", Counter, "Calls killed past the tick limit.", g(&self.cpu_limit_killed)),
            ("host_time_killed", "combd_host_time_killed_total", Counter, "Calls killed past 1 s of host calls.", g(&self.host_time_killed)),
            ("sql_timeouts", "combd_sql_timeouts_total", Counter, "SQL statements interrupted past 100 ms.", g(&self.sql_timeouts)),
            ("sql_too_big", "combd_sql_too_big_total", Counter, "SQL values refused past 2 MB.", g(&self.sql_too_big)),
            ("db_full", "combd_db_full_total", Counter, "Writes refused at the database size cap.", g(&self.db_full)),
            ("send_limit_refused", "combd_send_limit_refused_total", Counter, "Sends refused past 16 MiB a request.", g(&self.send_limit_refused)),
            ("sends_foreign_dropped", "combd_sends_foreign_dropped_total", Counter, "Sends an object addressed to another object's session, dropped.", g(&self.sends_foreign_dropped)),
            ("sql_denied", "combd_sql_denied_total", Counter, "Calls failed for a SQL statement apps may not run (ATTACH, PRAGMA, transaction control...).", g(&self.sql_denied)),
            ("reloads", "combd_reloads_total", Counter, "Objects reloaded after a killed call.", g(&self.reloads)),
            ("memory_limit_killed", "combd_memory_limit_killed_total", Counter, "Calls killed past their app's memory_kb.", g(&self.memory_limit_killed)),
            ("ws_slow_closed", "combd_ws_slow_closed_total", Counter, "WebSockets closed with 8 MiB waiting.", g(&self.ws_slow_closed)),
            ("outbound_budget_closed", "combd_outbound_budget_closed_total", Counter, "Connections closed at the shard's outbound budget.", g(&self.outbound_budget_closed)),
            ("ws_app_removed_closed", "combd_ws_app_removed_closed_total", Counter, "Sessions closed because their app was removed.", g(&self.ws_app_removed_closed)),
            ("ws_object_deleted_closed", "combd_ws_object_deleted_closed_total", Counter, "Sessions closed (4404) because their object was deleted.", g(&self.ws_object_deleted_closed)),
            ("objects_expired", "combd_objects_expired_total", Counter, "Objects deleted because they went unwritten longer than their app's expiry.", g(&self.objects_expired)),
            ("objects_expiry_kept", "combd_objects_expiry_kept_total", Counter, "Objects past their app's expiry kept: written since, or with alarms or messages pending.", g(&self.objects_expiry_kept)),
            ("objects_migrated", "combd_objects_migrated_total", Counter, "Objects brought to their app's version as they opened.", g(&self.objects_migrated)),
            ("objects_migration_failed", "combd_objects_migration_failed_total", Counter, "Opens refused (503 migration failed) because a migration step failed; the object stays as it was.", g(&self.objects_migration_failed)),
            ("ws_object_restored_closed", "combd_ws_object_restored_closed_total", Counter, "Sessions closed (1012) because their object was replaced by a restore.", g(&self.ws_object_restored_closed)),
            ("objects_restored", "combd_objects_restored_total", Counter, "Objects restored from the backup, in place or into a new name.", g(&self.objects_restored)),
            ("objects_deleted", "combd_objects_deleted_total", Counter, "Objects deleted: their database, alarms, outbox, inbox and logs removed.", g(&self.objects_deleted)),
            ("ws_lease_lost_closed", "combd_ws_lease_lost_closed_total", Counter, "Sessions closed (1013) because this node's fleet lease was lost: their objects may be another node's now.", g(&self.ws_lease_lost_closed)),
            ("outbound_bytes", "combd_outbound_bytes", Gauge, "Bytes waiting to be written.", g(&self.outbound_bytes)),
            ("outbound_bytes_max", "combd_outbound_bytes_max", Gauge, "The most bytes waiting at once.", g(&self.outbound_bytes_max)),
            ("pipeline_held_waits", "combd_pipeline_held_waits_total", Counter, "Times a connection wrote its 64 KiB of held responses before answering more.", g(&self.pipeline_held_waits)),
            ("slow_reads_paced", "combd_slow_reads_paced_total", Counter, "Times a slow request's connection paused its reading (read at most once a second).", g(&self.slow_reads_paced)),
            ("pipeline_held_bytes_max", "combd_pipeline_held_bytes_max", Gauge, "The most bytes of responses one connection held at once.", g(&self.pipeline_held_bytes_max)),
            ("inbound_bytes", "combd_inbound_bytes", Gauge, "Bytes of clients' input waiting in mailboxes and inboxes.", g(&self.inbound_bytes)),
            ("inbound_bytes_max", "combd_inbound_bytes_max", Gauge, "The most inbound bytes held at once.", g(&self.inbound_bytes_max)),
            ("inbound_refused", "combd_inbound_refused_total", Counter, "Inputs refused past the shard's inbound budget.", g(&self.inbound_refused)),
            ("inbound_waits", "combd_inbound_waits_total", Counter, "Times a connection stopped being read for its input waiting.", g(&self.inbound_waits)),
            ("ws_rate_closed", "combd_ws_rate_closed_total", Counter, "WebSockets closed past their message rate.", g(&self.ws_rate_closed)),
            ("ws_inflate_ratio_closed", "combd_ws_inflate_ratio_closed_total", Counter, "WebSockets closed for a compressed message past the ratio cap.", g(&self.ws_inflate_ratio_closed)),
            ("ws_inflate_rate_closed", "combd_ws_inflate_rate_closed_total", Counter, "WebSockets closed past their decompressed bytes a second.", g(&self.ws_inflate_rate_closed)),
            ("ws_ping_timeouts", "combd_ws_ping_timeouts_total", Counter, "WebSockets closed for not answering a ping.", g(&self.ws_ping_timeouts)),
            ("tls_handshakes", "combd_tls_handshakes_total", Counter, "TLS handshakes completed.", g(&self.tls_handshakes)),
            ("tls_handshake_failures", "combd_tls_handshake_failures_total", Counter, "TLS handshakes failed or timed out.", g(&self.tls_handshake_failures)),
            ("tls_handshakes_in_progress", "combd_tls_handshakes_in_progress", Gauge, "TLS handshakes in progress.", g(&self.tls_handshakes_in_progress)),
            ("tls_handshakes_refused", "combd_tls_handshakes_refused_total", Counter, "TLS connections closed past the handshake cap.", g(&self.tls_handshakes_refused)),
            ("tls_hello_timeouts", "combd_tls_hello_timeouts_total", Counter, "TLS connections closed with no complete ClientHello by the hello timeout.", g(&self.tls_hello_timeouts)),
            ("turn_yields", "combd_turn_yields_total", Counter, "Times a budgeted loop yielded the shard's loop.", g(&self.turn_yields)),
            ("turn_overruns", "combd_turn_overruns_total", Counter, "Turns of the shard's loop longer than 10 ms.", g(&self.turn_overruns)),
            ("fanouts_in_progress", "combd_fanouts_in_progress", Gauge, "Broadcasts being fanned out now.", g(&self.fanouts_in_progress)),
            ("session_resyncs", "combd_session_resyncs_total", Counter, "Sessions resynced after missing messages.", g(&self.session_resyncs)),
            ("session_resumes", "combd_session_resumes_total", Counter, "Numbered sessions that missed messages and resumed from their topic's log.", g(&self.session_resumes)),
            ("presence_changes", "combd_presence_changes_total", Counter, "Changes of a topic's presence sent to its numbered sessions (one a topic a batch).", g(&self.presence_changes)),
            ("presence_unlisted", "combd_presence_unlisted_total", Counter, "Sessions attached to a topic that keeps presence but not listed in it (COMBD_PRESENCE_TOPIC_MAX, COMBD_PRESENCE_MAX or their client's share).", g(&self.presence_unlisted)),
            ("ws_subscriptions", "combd_ws_subscriptions", Gauge, "Subscriptions of multiplexed WebSockets (/ws) open now.", g(&self.ws_subscriptions)),
            ("ws_subscriptions_refused", "combd_ws_subscriptions_refused_total", Counter, "Subscribes refused, whatever the reason (the socket's bound COMBD_WS_SUBSCRIPTIONS, the node's pool, the app or its object, the owner in a fleet).", g(&self.ws_subscriptions_refused)),
            ("access_log_lines", "combd_access_log_lines_total", Counter, "Access-log lines queued for the writer.", g(&self.access_log_lines)),
            ("access_log_dropped", "combd_access_log_dropped_total", Counter, "Access-log lines dropped with every chunk waiting for the writer.", g(&self.access_log_dropped)),
            ("app_errors_log_suppressed", "combd_app_errors_log_suppressed_total", Counter, "Warnings about apps' failed calls not logged past the rate.", g(&self.app_errors_log_suppressed)),
        ]
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node(memory_budget_source: &'static str) -> NodeFigures {
        NodeFigures {
            uptime_ms: 5000,
            max_conns_effective: 9,
            draining: 0,
            memory_budget_source,
            full_reason: "none".into(),
            apps: Vec::new(),
            objects: Vec::new(),
            figures: vec![(
                "pressure",
                "combd_pressure",
                Kind::Gauge,
                "Memory pressure.",
                2,
            )],
            limits: vec![("max_awake", 1000)],
        }
    }

    #[test]
    fn json_sums_shards_and_lists_each() {
        let shards = [ShardStats::default(), ShardStats::default()];
        ShardStats::add(&shards[0].conns, 3);
        ShardStats::add(&shards[1].conns, 4);
        ShardStats::add(&shards[1].bytes_in, 10);
        let node = node("env");
        let v: serde_json::Value = serde_json::from_str(&render_json(&node, &shards)).unwrap();
        assert_eq!(v["conns"], 7);
        assert_eq!(v["bytes_in"], 10);
        assert_eq!(v["shards"][0]["conns"], 3);
        assert_eq!(v["shards"][1]["conns"], 4);
        assert_eq!(v["max_conns_effective"], 9);
        assert_eq!(v["pressure"], 2);
        assert_eq!(v["memory_budget_source"], "env");
        assert_eq!(v["limits"]["max_awake"], 1000);
    }

    #[test]
    fn metrics_have_help_type_and_shard_labels() {
        let shards = [ShardStats::default(), ShardStats::default()];
        ShardStats::add(&shards[1].accepted, 2);
        let node = node("cgroup1");
        let text = render_metrics(&node, &shards);
        assert!(text.contains("# TYPE combd_accepted_total counter\n"));
        assert!(text.contains("combd_accepted_total{shard=\"1\"} 2\n"));
        assert!(text.contains("# TYPE combd_conns gauge\n"));
        assert!(text.contains("combd_pressure 2\n"));
        assert!(text.contains("combd_memory_budget_info{source=\"cgroup1\"} 1\n"));
        assert!(text.contains("combd_limit{name=\"max_awake\"} 1000\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = line.rsplit_once(' ').expect("name value");
            v.parse::<u64>().expect("numeric sample");
        }
    }
}
