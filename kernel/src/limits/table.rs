//! Every fixed bound of this module as `/stats` shows it under `limits`: its name there, the
//! constant, and its value (durations in milliseconds, or microseconds for a name ending in
//! `_us`). `/stats` is written from [`FIXED`] and the settings; the test below fails when a
//! constant of this module is in neither [`FIXED`] nor [`SETTING_DEFAULTS`] (a setting's
//! default, shown under the setting's own name), so a new bound cannot be left out of `/stats`.

use super::*;

/// One fixed bound as `/stats` shows it.
#[derive(Debug, Clone, Copy)]
pub struct Fixed {
    /// Its name under `limits` in `/stats` (and `/metrics`' labels).
    pub name: &'static str,
    /// The constant of this module it is.
    pub constant: &'static str,
    /// Its value.
    pub value: u64,
}

macro_rules! fixed {
    ($name:literal, $c:ident) => {
        Fixed {
            name: $name,
            constant: stringify!($c),
            value: $c as u64,
        }
    };
    ($name:literal, $c:ident, ms) => {
        Fixed {
            name: $name,
            constant: stringify!($c),
            value: $c.as_millis() as u64,
        }
    };
    ($name:literal, $c:ident, us) => {
        Fixed {
            name: $name,
            constant: stringify!($c),
            value: $c.as_micros() as u64,
        }
    };
}

/// Every fixed bound, in the order this module declares them.
pub const FIXED: &[Fixed] = &[
    fixed!("header_section_max_bytes", HEADER_SECTION_MAX_BYTES),
    fixed!("header_count_max", HEADER_COUNT_MAX),
    fixed!("url_max_bytes", URL_MAX_BYTES),
    fixed!("allowed_origins_max", ALLOWED_ORIGINS_MAX),
    fixed!("alarms_per_object_max", ALARMS_PER_OBJECT_MAX),
    fixed!("alarm_payload_max_bytes", ALARM_PAYLOAD_MAX_BYTES),
    fixed!("alarm_wakes_per_tick", ALARM_WAKES_PER_TICK),
    fixed!("alarm_read_gap_ms", ALARM_READ_GAP_MS),
    fixed!("alarms_per_wake", ALARMS_PER_WAKE),
    fixed!("alarm_retry_min_ms", ALARM_RETRY_MIN_MS),
    fixed!("alarm_retry_max_ms", ALARM_RETRY_MAX_MS),
    fixed!("alarm_wake_retry_ms", ALARM_WAKE_RETRY_MS),
    fixed!("object_message_max_bytes", OBJECT_MESSAGE_MAX_BYTES),
    fixed!("outbox_max", OUTBOX_MAX),
    fixed!("object_list_page", OBJECT_LIST_PAGE),
    fixed!("object_list_page_max", OBJECT_LIST_PAGE_MAX),
    fixed!("object_sql_rows_max", OBJECT_SQL_ROWS_MAX),
    fixed!("object_sql_time_limit_ms", OBJECT_SQL_TIME_LIMIT, ms),
    fixed!("object_sql_answer_max_bytes", OBJECT_SQL_ANSWER_MAX_BYTES),
    fixed!("object_expiry_per_sweep", OBJECT_EXPIRY_PER_SWEEP),
    fixed!("backup_retention_min_ms", BACKUP_RETENTION_MIN, ms),
    fixed!("backup_queue_max_bytes", BACKUP_QUEUE_MAX_BYTES),
    fixed!("backup_checkpoint_wal_bytes", BACKUP_CHECKPOINT_WAL_BYTES),
    fixed!("backup_wal_max_bytes", BACKUP_WAL_MAX_BYTES),
    fixed!("backup_snapshot_after_bytes", BACKUP_SNAPSHOT_AFTER_BYTES),
    fixed!("backup_round_interval_ms", BACKUP_ROUND_INTERVAL, ms),
    fixed!("backup_open_files", BACKUP_OPEN_FILES),
    fixed!("backup_prune_interval_ms", BACKUP_PRUNE_INTERVAL, ms),
    fixed!("backup_lag_warn_ms", BACKUP_LAG_WARN, ms),
    fixed!("backup_checkpoint_wait_ms", BACKUP_CHECKPOINT_WAIT, ms),
    fixed!(
        "backup_bucket_round_interval_ms",
        BACKUP_BUCKET_ROUND_INTERVAL,
        ms
    ),
    fixed!("backup_bucket_log_chunks_max", BACKUP_BUCKET_LOG_CHUNKS_MAX),
    fixed!("backup_bucket_base_max_bytes", BACKUP_BUCKET_BASE_MAX_BYTES),
    fixed!(
        "object_expiry_sweep_interval_ms",
        OBJECT_EXPIRY_SWEEP_INTERVAL,
        ms
    ),
    fixed!("reminders_pending_max", REMINDERS_PENDING_MAX),
    fixed!("reminders_per_client_max", REMINDERS_PER_CLIENT_MAX),
    fixed!("reminders_fired_kept", REMINDERS_FIRED_KEPT),
    fixed!("reminder_list_max_bytes", REMINDER_LIST_MAX_BYTES),
    fixed!("chat_history_messages", CHAT_HISTORY_MESSAGES),
    fixed!("chat_text_max_bytes", CHAT_TEXT_MAX_BYTES),
    fixed!("chat_retain_messages", CHAT_RETAIN_MESSAGES),
    fixed!("chat_room_expiry_ms", CHAT_ROOM_EXPIRY, ms),
    fixed!("reminder_expiry_ms", REMINDER_EXPIRY, ms),
    fixed!("topic_log_frames", TOPIC_LOG_FRAMES),
    fixed!("topic_log_bytes", TOPIC_LOG_BYTES),
    fixed!("topic_log_age_ms", TOPIC_LOG_AGE, ms),
    fixed!("topic_log_replay_batch_bytes", TOPIC_LOG_REPLAY_BATCH_BYTES),
    fixed!("app_headers_max", APP_HEADERS_MAX),
    fixed!("app_header_value_max_bytes", APP_HEADER_VALUE_MAX_BYTES),
    fixed!("app_headers_max_bytes", APP_HEADERS_MAX_BYTES),
    fixed!("app_path_rest_max_bytes", APP_PATH_REST_MAX_BYTES),
    fixed!("app_cors_origins_max", APP_CORS_ORIGINS_MAX),
    fixed!("cors_max_age_seconds", CORS_MAX_AGE_SECONDS),
    fixed!("auth_claim_max_bytes", AUTH_CLAIM_MAX_BYTES),
    fixed!("auth_token_max_bytes", AUTH_TOKEN_MAX_BYTES),
    fixed!("auth_hs256_secret_min_bytes", AUTH_HS256_SECRET_MIN_BYTES),
    fixed!("auth_key_file_max_bytes", AUTH_KEY_FILE_MAX_BYTES),
    fixed!("auth_leeway_seconds", AUTH_LEEWAY_SECONDS),
    fixed!("auth_token_cache_entries", AUTH_TOKEN_CACHE_ENTRIES),
    fixed!("auth_verify_rate_per_client", AUTH_VERIFY_RATE_PER_CLIENT),
    fixed!("auth_verify_clients_max", AUTH_VERIFY_CLIENTS_MAX),
    fixed!("read_scratch_bytes", READ_SCRATCH_BYTES),
    fixed!("pipeline_held_max_bytes", PIPELINE_HELD_MAX_BYTES),
    fixed!("slow_request_after_ms", SLOW_REQUEST_AFTER, ms),
    fixed!("slow_read_interval_ms", SLOW_READ_INTERVAL, ms),
    fixed!("slow_read_min_bytes", SLOW_READ_MIN_BYTES),
    fixed!("http_object_pipeline", HTTP_OBJECT_PIPELINE),
    fixed!("listen_backlog", LISTEN_BACKLOG),
    fixed!("fd_reserve", FD_RESERVE),
    fixed!("local_conns_max", LOCAL_CONNS_MAX),
    fixed!("object_fds", OBJECT_FDS),
    fixed!("nofile_fallback", NOFILE_FALLBACK),
    fixed!("close_linger_ms", CLOSE_LINGER, ms),
    fixed!(
        "close_linger_discard_max_bytes",
        CLOSE_LINGER_DISCARD_MAX_BYTES
    ),
    fixed!("write_stall_timeout_ms", WRITE_STALL_TIMEOUT, ms),
    fixed!("tcp_keepidle_secs", TCP_KEEPIDLE_SECS),
    fixed!("tcp_keepintvl_secs", TCP_KEEPINTVL_SECS),
    fixed!("tcp_keepcnt", TCP_KEEPCNT),
    fixed!("accept_error_pause_ms", ACCEPT_ERROR_PAUSE, ms),
    fixed!("accept_error_log_every_ms", ACCEPT_ERROR_LOG_EVERY, ms),
    fixed!("tls_handshakes_max", TLS_HANDSHAKES_MAX),
    fixed!("tls_send_buffer_max_bytes", TLS_SEND_BUFFER_MAX_BYTES),
    fixed!("ws_control_payload_max_bytes", WS_CONTROL_PAYLOAD_MAX_BYTES),
    fixed!("ws_deflate_min_bytes", WS_DEFLATE_MIN_BYTES),
    fixed!("ws_slow_close_bytes", WS_SLOW_CLOSE_BYTES),
    fixed!("ws_inflate_ratio_max", WS_INFLATE_RATIO_MAX),
    fixed!("ws_inflate_ratio_floor_bytes", WS_INFLATE_RATIO_FLOOR_BYTES),
    fixed!("ws_decode_bytes_per_turn", WS_DECODE_BYTES_PER_TURN),
    fixed!("shard_tick_ms", SHARD_TICK, ms),
    fixed!("turn_overrun_ms", TURN_OVERRUN, ms),
    fixed!("fanout_per_turn", FANOUT_PER_TURN),
    fixed!("turn_yield_pause_us", TURN_YIELD_PAUSE, us),
    fixed!("inbox_per_turn", INBOX_PER_TURN),
    fixed!("ping_sweep_per_turn", PING_SWEEP_PER_TURN),
    fixed!("accept_drain_max", ACCEPT_DRAIN_MAX),
    fixed!("shard_io_memory_bytes", SHARD_IO_MEMORY_BYTES),
    fixed!("shard_ring_depth", SHARD_RING_DEPTH),
    fixed!("cross_shard_queue", CROSS_SHARD_QUEUE),
    fixed!("blocking_threads_per_shard", BLOCKING_THREADS_PER_SHARD),
    fixed!("blocking_threads_per_client", BLOCKING_THREADS_PER_CLIENT),
    fixed!(
        "blocking_compute_shared_per_client",
        BLOCKING_COMPUTE_SHARED_PER_CLIENT
    ),
    fixed!(
        "blocking_client_active_window_ms",
        BLOCKING_CLIENT_ACTIVE_WINDOW,
        ms
    ),
    fixed!("object_name_max_bytes", OBJECT_NAME_MAX_BYTES),
    fixed!("mailbox_default", MAILBOX_DEFAULT),
    fixed!("batch_default", BATCH_DEFAULT),
    fixed!("object_unsynced_batches", OBJECT_UNSYNCED_BATCHES),
    fixed!("wal_sync_slow_ms", WAL_SYNC_SLOW, ms),
    fixed!("session_mailbox", SESSION_MAILBOX),
    fixed!("session_mailbox_behind", SESSION_MAILBOX_BEHIND),
    fixed!("object_idle_ms", OBJECT_IDLE, ms),
    fixed!(
        "object_idle_under_pressure_ms",
        OBJECT_IDLE_UNDER_PRESSURE,
        ms
    ),
    fixed!("host_call_ticks", HOST_CALL_TICKS),
    fixed!("host_time_ms", HOST_TIME_LIMIT, ms),
    fixed!("slow_call_ms", SLOW_CALL, ms),
    fixed!("log_max_bytes", LOG_MAX_BYTES),
    fixed!("sends_max_bytes", SENDS_MAX_BYTES),
    fixed!("wasm_memory_kb_default", WASM_MEMORY_KB_DEFAULT),
    fixed!("wasm_table_element_bytes", WASM_TABLE_ELEMENT_BYTES),
    fixed!("wasm_module_max_bytes", WASM_MODULE_MAX_BYTES),
    fixed!("wasm_load_ticks", WASM_LOAD_TICKS),
    fixed!("wasm_topic_ticks", WASM_TOPIC_TICKS),
    fixed!("wasm_bytes_per_tick", WASM_BYTES_PER_TICK),
    fixed!("wasm_text_max_bytes", WASM_TEXT_MAX_BYTES),
    fixed!("wasm_call_deadline_ms", WASM_CALL_DEADLINE, ms),
    fixed!("wasm_topic_deadline_ms", WASM_TOPIC_DEADLINE, ms),
    fixed!("wasm_epoch_tick_ms", WASM_EPOCH_TICK, ms),
    fixed!("sql_statement_ms", SQL_STATEMENT_LIMIT, ms),
    fixed!("sql_progress_steps", SQL_PROGRESS_STEPS),
    fixed!("sql_value_max_bytes", SQL_VALUE_MAX_BYTES),
    fixed!("sqlite_busy_timeout_ms", SQLITE_BUSY_TIMEOUT, ms),
    fixed!("pressure_1_percent", PRESSURE_1_PERCENT),
    fixed!("pressure_2_percent", PRESSURE_2_PERCENT),
    fixed!("machine_reserve_divisor", MACHINE_RESERVE_DIVISOR),
    fixed!("state_hold_ms", STATE_HOLD, ms),
    fixed!("measure_interval_ms", MEASURE_INTERVAL, ms),
    fixed!("measure_every_accepts", MEASURE_EVERY_ACCEPTS),
    fixed!("disk_low_divisor", DISK_LOW_DIVISOR),
    fixed!("disk_low_max_bytes", DISK_LOW_MAX_BYTES),
    fixed!("measure_error_log_every_ms", MEASURE_ERROR_LOG_EVERY, ms),
    fixed!("summary_every_ms", SUMMARY_EVERY, ms),
    fixed!("watchdog_stall_ms", WATCHDOG_STALL, ms),
    fixed!("coordinator_wait_min_ms", COORDINATOR_WAIT_MIN, ms),
    fixed!("outbound_budget_divisor", OUTBOUND_BUDGET_DIVISOR),
    fixed!("inbound_budget_divisor", INBOUND_BUDGET_DIVISOR),
    fixed!(
        "inbound_conn_queued_max_bytes",
        INBOUND_CONN_QUEUED_MAX_BYTES
    ),
    fixed!("inbound_conn_floor_bytes", INBOUND_CONN_FLOOR_BYTES),
    fixed!("inbound_measure_steps", INBOUND_MEASURE_STEPS),
    fixed!("address_idle_entries_max", ADDRESS_IDLE_ENTRIES_MAX),
    fixed!("prefix_56_shares", PREFIX_56_SHARES),
    fixed!("prefix_48_shares", PREFIX_48_SHARES),
    fixed!("object_create_burst_seconds", OBJECT_CREATE_BURST_SECONDS),
    fixed!("ws_send_buffer_bytes", WS_SEND_BUFFER_BYTES),
    fixed!("access_log_chunk_bytes", ACCESS_LOG_CHUNK_BYTES),
    fixed!("access_log_chunks_per_shard", ACCESS_LOG_CHUNKS_PER_SHARD),
    fixed!("access_log_shard_bytes", ACCESS_LOG_SHARD_BYTES),
    fixed!("access_log_line_max_bytes", ACCESS_LOG_LINE_MAX_BYTES),
    fixed!("access_log_method_max_bytes", ACCESS_LOG_METHOD_MAX_BYTES),
    fixed!("access_log_path_max_bytes", ACCESS_LOG_PATH_MAX_BYTES),
    fixed!("access_log_fields_max_bytes", ACCESS_LOG_FIELDS_MAX_BYTES),
    fixed!(
        "access_log_stderr_write_bytes",
        ACCESS_LOG_STDERR_WRITE_BYTES
    ),
    fixed!("access_log_writer_wait_ms", ACCESS_LOG_WRITER_WAIT, ms),
    fixed!(
        "access_log_error_log_every_ms",
        ACCESS_LOG_ERROR_LOG_EVERY,
        ms
    ),
    fixed!("app_error_log_window_ms", APP_ERROR_LOG_WINDOW, ms),
    fixed!("app_error_logs_per_window", APP_ERROR_LOGS_PER_WINDOW),
    fixed!("app_error_detail_max_bytes", APP_ERROR_DETAIL_MAX_BYTES),
    fixed!("fleet_lease_ttl_min_ms", FLEET_LEASE_TTL_MIN, ms),
    fixed!("fleet_lease_ttl_max_ms", FLEET_LEASE_TTL_MAX, ms),
    fixed!("fleet_object_idle_min_ms", FLEET_OBJECT_IDLE_MIN, ms),
    fixed!("fleet_object_idle_max_ms", FLEET_OBJECT_IDLE_MAX, ms),
    fixed!("fleet_keepalive_divisor", FLEET_KEEPALIVE_DIVISOR),
    fixed!(
        "fleet_lease_regrant_interval_ms",
        FLEET_LEASE_REGRANT_INTERVAL,
        ms
    ),
    fixed!(
        "fleet_coordinator_timeout_ms",
        FLEET_COORDINATOR_TIMEOUT,
        ms
    ),
    fixed!(
        "fleet_authenticate_timeout_ms",
        FLEET_AUTHENTICATE_TIMEOUT,
        ms
    ),
    fixed!("fleet_bucket_timeout_ms", FLEET_BUCKET_TIMEOUT, ms),
    fixed!("fleet_bucket_retries", FLEET_BUCKET_RETRIES),
    fixed!("fleet_bucket_retry_wait_ms", FLEET_BUCKET_RETRY_WAIT, ms),
    fixed!("fleet_segment_max_bytes", FLEET_SEGMENT_MAX_BYTES),
    fixed!(
        "fleet_restore_segments_max_bytes",
        FLEET_RESTORE_SEGMENTS_MAX_BYTES
    ),
    fixed!("fleet_db_max_bytes", FLEET_DB_MAX_BYTES),
    fixed!("fleet_snapshot_max_bytes", FLEET_SNAPSHOT_MAX_BYTES),
    fixed!("fleet_list_keys_max", FLEET_LIST_KEYS_MAX),
    fixed!(
        "fleet_coordinator_answer_max_bytes",
        FLEET_COORDINATOR_ANSWER_MAX_BYTES
    ),
    fixed!("fleet_list_answer_max_bytes", FLEET_LIST_ANSWER_MAX_BYTES),
    fixed!("fleet_list_page_keys", FLEET_LIST_PAGE_KEYS),
    fixed!("fleet_error_body_max_bytes", FLEET_ERROR_BODY_MAX_BYTES),
    fixed!("fleet_connect_timeout_ms", FLEET_CONNECT_TIMEOUT, ms),
    fixed!(
        "fleet_probe_connect_timeout_ms",
        FLEET_PROBE_CONNECT_TIMEOUT,
        ms
    ),
    fixed!("fleet_forward_timeout_ms", FLEET_FORWARD_TIMEOUT, ms),
    fixed!(
        "fleet_owner_retry_interval_ms",
        FLEET_OWNER_RETRY_INTERVAL,
        ms
    ),
    fixed!("fleet_unreachable_max", FLEET_UNREACHABLE_MAX),
    fixed!("fleet_routes_max", FLEET_ROUTES_MAX),
    fixed!("fleet_lookups_max", FLEET_LOOKUPS_MAX),
    fixed!(
        "fleet_wake_sweep_interval_ms",
        FLEET_WAKE_SWEEP_INTERVAL,
        ms
    ),
    fixed!("fleet_wake_sweep_max", FLEET_WAKE_SWEEP_MAX),
    fixed!("fleet_key_min_bytes", FLEET_KEY_MIN_BYTES),
    fixed!("fleet_auth_skew_ms", FLEET_AUTH_SKEW, ms),
    fixed!("fleet_auth_replays_max", FLEET_AUTH_REPLAYS_MAX),
    fixed!(
        "fleet_forward_answer_max_bytes",
        FLEET_FORWARD_ANSWER_MAX_BYTES
    ),
    fixed!("fleet_checkpoint_wal_bytes", FLEET_CHECKPOINT_WAL_BYTES),
    fixed!(
        "fleet_snapshot_after_segments",
        FLEET_SNAPSHOT_AFTER_SEGMENTS
    ),
    fixed!("fleet_restore_parallel_gets", FLEET_RESTORE_PARALLEL_GETS),
    fixed!("fleet_unshipped_batches", FLEET_UNSHIPPED_BATCHES),
    fixed!("fleet_uploads_in_flight", FLEET_UPLOADS_IN_FLIGHT),
    fixed!("fleet_upload_threads", FLEET_UPLOAD_THREADS),
    fixed!("fleet_etcd_endpoints_max", FLEET_ETCD_ENDPOINTS_MAX),
    fixed!("fleet_idle_connections", FLEET_IDLE_CONNECTIONS),
];

/// The constants of this module that are a setting's default: `/stats` shows the setting's
/// value in force under its own name instead.
pub const SETTING_DEFAULTS: &[&str] = &[
    "LISTEN_DEFAULT",
    "DATA_DEFAULT",
    "APPS_DIR_DEFAULT",
    "LOG_DEFAULT",
    "MAX_BODY_DEFAULT_BYTES",
    "HEADER_TIMEOUT_DEFAULT",
    "BODY_TIMEOUT_DEFAULT",
    "IDLE_TIMEOUT_DEFAULT",
    "WS_MAX_MESSAGE_DEFAULT_BYTES",
    "SHUTDOWN_TIMEOUT_DEFAULT",
    "MAX_CONNS_DEFAULT",
    "MAX_CONNS_PER_ADDRESS_DEFAULT",
    "ACCEPT_RATE_PER_ADDRESS_DEFAULT",
    "CLIENT_SHARE_MAX_PERCENT_DEFAULT",
    "CLIENT_SHARE_MIN_PERCENT_DEFAULT",
    "MAX_OPEN_OBJECTS_DEFAULT",
    "MAX_AWAKE_DEFAULT",
    "RESTORES_AT_ONCE_DEFAULT",
    "CPU_LIMIT_TICKS_DEFAULT",
    "MODULE_MEMORY_MAX_DEFAULT_BYTES",
    "DB_MAX_BYTES",
    "MAX_OBJECTS_PER_APP_DEFAULT",
    "OBJECT_CREATE_RATE_DEFAULT",
    "PRESENCE_MAX_DEFAULT",
    "PRESENCE_TOPIC_MAX_DEFAULT",
    "WS_SUBSCRIPTIONS_DEFAULT",
    "SUBSCRIPTIONS_MAX_DEFAULT",
    "WS_RATE_DEFAULT",
    "WS_BURST_DEFAULT",
    "WS_INFLATE_RATE_DEFAULT_BYTES",
    "TLS_HANDSHAKE_TIMEOUT_DEFAULT",
    "TLS_HELLO_TIMEOUT_DEFAULT",
    "WS_PING_INTERVAL_DEFAULT",
    "WS_SLOW_TIMEOUT_DEFAULT",
    "BACKUP_RETENTION_DEFAULT",
    "FLEET_LEASE_TTL_DEFAULT",
    "FLEET_OBJECT_IDLE_DEFAULT",
    "FLEET_BUCKET_REGION_DEFAULT",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of this module's constants, from its source.
    fn constants() -> Vec<&'static str> {
        [
            include_str!("mod.rs"),
            include_str!("apps.rs"),
            include_str!("defaults.rs"),
            include_str!("fleet.rs"),
            include_str!("logs.rs"),
            include_str!("inspect.rs"),
            include_str!("backup.rs"),
        ]
        .into_iter()
        .flat_map(str::lines)
        .filter_map(|l| l.strip_prefix("pub const "))
        .filter_map(|l| l.split(':').next())
        .collect()
    }

    #[test]
    fn every_constant_is_in_stats_or_a_settings_default() {
        let all = constants();
        assert!(all.len() > 100, "the source was read: {}", all.len());
        for c in &all {
            let fixed = FIXED.iter().filter(|f| f.constant == *c).count();
            let default = SETTING_DEFAULTS.contains(c);
            assert!(
                fixed + usize::from(default) == 1,
                "{c}: add it to FIXED (or, a setting's default, to SETTING_DEFAULTS), once"
            );
        }
        for f in FIXED {
            assert!(
                all.contains(&f.constant),
                "{} is not a constant here",
                f.constant
            );
        }
        for d in SETTING_DEFAULTS {
            assert!(all.contains(d), "{d} is not a constant here");
        }
    }

    #[test]
    fn names_are_unique_and_durations_say_their_unit() {
        let mut names: Vec<&str> = FIXED.iter().map(|f| f.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a name twice");
        assert_eq!(
            FIXED
                .iter()
                .find(|f| f.name == "close_linger_ms")
                .map(|f| f.value),
            Some(2000)
        );
        assert_eq!(
            FIXED
                .iter()
                .find(|f| f.name == "turn_yield_pause_us")
                .map(|f| f.value),
            Some(TURN_YIELD_PAUSE.as_micros() as u64)
        );
    }
}
