//! The coordinator: the one non-shard thread. It measures memory, disk and connections every
//! [`MEASURE_INTERVAL`] and whenever a shard asks (every
//! [`MEASURE_EVERY_ACCEPTS`](combd_kernel::limits::MEASURE_EVERY_ACCEPTS) accepts, or at the
//! connection cap), decides with `combd_kernel::admission` whether the node is full, publishes
//! the decision in atomics and wakes the shards so they stop or resume their public listeners.
//! Every interval it keeps is in `combd_kernel::limits`.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use combd_kernel::admission::{self, AdmissionState, FullReasons, Measurements};
use combd_kernel::limits::{
    COORDINATOR_WAIT_MIN, MEASURE_ERROR_LOG_EVERY, MEASURE_INTERVAL, STATE_HOLD, SUMMARY_EVERY,
    WATCHDOG_STALL,
};
use combd_kernel::memory::MemoryProbe;
use combd_kernel::sys;
use combd_shards::NodeShared;
use tracing::{info, warn};

/// Runs the coordinator until the node drains.
pub fn run(node: Arc<NodeShared>, probe: MemoryProbe, wake: Receiver<()>) {
    let started = Instant::now();
    let mut hold = AdmissionState::START;
    let mut last_error: Option<Instant> = None;
    let watchdog = crate::notify::watchdog_interval();
    let mut last_ping = Instant::now();
    let mut summary = Summary::new(&node);
    let mut last_sweep = Instant::now();
    loop {
        let want_full = measure(&node, &probe, &mut last_error);
        // Once a second however often the coordinator is woken: the sweep holds the address
        // table's lock, which every accept and close takes.
        if last_sweep.elapsed() >= MEASURE_INTERVAL {
            last_sweep = Instant::now();
            node.addresses.sweep(last_sweep);
        }
        summary.tick(&node);
        if let Some(every) = watchdog {
            // Ping only while every shard's tick runs: a stalled shard stops the pings and
            // systemd restarts the node.
            if last_ping.elapsed() >= every && node.shards_alive(WATCHDOG_STALL.as_millis() as u64)
            {
                crate::notify::notify("WATCHDOG=1");
                last_ping = Instant::now();
            }
        }
        let now_ms = started.elapsed().as_millis() as u64;
        if hold.decide(want_full.any(), now_ms) {
            publish_state(&node, hold.full, want_full);
        }
        if node.draining() {
            return;
        }
        // A change held back by the hold is due when the hold ends: wake then, not later.
        let timeout = match hold.since_ms {
            Some(since) if want_full.any() != hold.full => {
                let due = since + STATE_HOLD.as_millis() as u64;
                Duration::from_millis(due.saturating_sub(now_ms)).min(MEASURE_INTERVAL)
            }
            _ => MEASURE_INTERVAL,
        };
        let timeout = match watchdog {
            Some(every) => timeout.min(
                every
                    .saturating_sub(last_ping.elapsed())
                    .max(COORDINATOR_WAIT_MIN),
            ),
            None => timeout,
        };
        match wake.recv_timeout(timeout) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Takes one measurement, publishes the figures, and returns why the node would be full.
fn measure(
    node: &NodeShared,
    probe: &MemoryProbe,
    last_error: &mut Option<Instant>,
) -> FullReasons {
    let a = &node.admission;
    let level = measure_memory(node, probe, last_error);
    measure_disk(node, last_error);
    let m = Measurements {
        pressure: level,
        conns: node.conns(),
        max_conns: node.max_conns_effective,
        shards_behind: node
            .stats
            .iter()
            .filter(|s| s.behind.load(Ordering::Relaxed) != 0)
            .count(),
        shards: node.stats.len(),
    };
    let reasons = admission::full_reasons(&m);
    a.full_reasons.store(reasons.0, Ordering::Relaxed);
    // Counted last, so a reader that sees a measurement counted sees its figures too.
    a.measurements.fetch_add(1, Ordering::Release);
    reasons
}

/// The node's and the machine's memory against the budget, published; the pressure level
/// (the last one when memory cannot be read).
fn measure_memory(node: &NodeShared, probe: &MemoryProbe, last_error: &mut Option<Instant>) -> u8 {
    let a = &node.admission;
    let m = match probe.sample() {
        Ok(m) => m,
        Err(e) => {
            rate_limited(last_error, || warn!("cannot measure memory: {e}"));
            return a.pressure.load(Ordering::Relaxed);
        }
    };
    let p = admission::pressure(
        m.own_bytes,
        probe.budget_bytes,
        m.machine_total_bytes,
        m.machine_available_bytes,
    );
    a.pressure.store(p.level, Ordering::Relaxed);
    a.memory_own_bytes.store(m.own_bytes, Ordering::Relaxed);
    a.memory_rss_bytes.store(m.rss_bytes, Ordering::Relaxed);
    a.memory_own_percent.store(p.own_percent, Ordering::Relaxed);
    a.memory_budget_bytes
        .store(probe.budget_bytes, Ordering::Relaxed);
    a.machine_total_bytes
        .store(m.machine_total_bytes, Ordering::Relaxed);
    a.machine_available_bytes
        .store(m.machine_available_bytes, Ordering::Relaxed);
    a.machine_percent
        .store(p.machine_percent, Ordering::Relaxed);
    a.tcp_kernel_bytes
        .store(m.tcp_kernel_bytes, Ordering::Relaxed);
    p.level
}

/// The data disk's free space, published, and whether it is low (logged when that changes).
fn measure_disk(node: &NodeShared, last_error: &mut Option<Instant>) {
    let a = &node.admission;
    match sys::disk_space(&node.settings.data_dir) {
        Ok((free, total)) => {
            let low = admission::disk_low(free, total);
            if low != a.disk_low() {
                if low {
                    warn!(
                        free_bytes = free,
                        total_bytes = total,
                        "data disk low: new objects get 507"
                    );
                } else {
                    info!(
                        free_bytes = free,
                        total_bytes = total,
                        "data disk no longer low"
                    );
                }
            }
            a.disk_low.store(low, Ordering::Relaxed);
            a.disk_free_bytes.store(free, Ordering::Relaxed);
        }
        Err(e) => rate_limited(last_error, || warn!("cannot measure the data disk: {e}")),
    }
}

fn publish_state(node: &NodeShared, full: bool, reasons: FullReasons) {
    let a = &node.admission;
    let changed = a.refusing.swap(full, Ordering::Relaxed) != full;
    if !changed {
        return;
    }
    let figures = (
        a.pressure.load(Ordering::Relaxed),
        a.memory_own_bytes.load(Ordering::Relaxed),
        a.memory_budget_bytes.load(Ordering::Relaxed),
        node.conns(),
        node.max_conns_effective,
    );
    if full {
        a.listen_stops.fetch_add(1, Ordering::Relaxed);
        warn!(
            reason = %reasons.describe(),
            pressure = figures.0,
            memory_own_bytes = figures.1,
            memory_budget_bytes = figures.2,
            conns = figures.3,
            max_conns = figures.4,
            "full: refusing new connections at TCP"
        );
    } else {
        info!(
            pressure = figures.0,
            memory_own_bytes = figures.1,
            conns = figures.3,
            "no longer full: listening again"
        );
    }
    node.wake_shards();
}

/// The rate-limited summary of refusals: at most one line per [`SUMMARY_EVERY`], and only when
/// something was refused.
struct Summary {
    at: Instant,
    refused_late: u64,
    mailbox_refused: u64,
}

fn totals(node: &NodeShared) -> (u64, u64) {
    node.stats.iter().fold((0, 0), |(a, b), s| {
        (
            a + s.refused_late.load(Ordering::Relaxed),
            b + s.mailbox_refused.load(Ordering::Relaxed),
        )
    })
}

impl Summary {
    fn new(node: &NodeShared) -> Summary {
        let (refused_late, mailbox_refused) = totals(node);
        Summary {
            at: Instant::now(),
            refused_late,
            mailbox_refused,
        }
    }

    fn tick(&mut self, node: &NodeShared) {
        if self.at.elapsed() < SUMMARY_EVERY {
            return;
        }
        let (late, mailbox) = totals(node);
        let (d_late, d_mailbox) = (late - self.refused_late, mailbox - self.mailbox_refused);
        if d_late > 0 || d_mailbox > 0 {
            info!(
                seconds = self.at.elapsed().as_secs(),
                refused_late = d_late,
                mailbox_refused = d_mailbox,
                tcp_refusing = node.admission.refusing(),
                "refusals since the last summary"
            );
        }
        *self = Summary {
            at: Instant::now(),
            refused_late: late,
            mailbox_refused: mailbox,
        };
    }
}

/// Runs `log` unless it ran less than [`MEASURE_ERROR_LOG_EVERY`] ago.
fn rate_limited(last: &mut Option<Instant>, log: impl FnOnce()) {
    if last.is_none_or(|t| t.elapsed() >= MEASURE_ERROR_LOG_EVERY) {
        log();
        *last = Some(Instant::now());
    }
}
