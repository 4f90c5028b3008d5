//! Starting and stopping a node: bind every shard's listeners, start one glommio executor per
//! shard pinned to its CPU, wait until all accept, and drain them on request.

use std::net::SocketAddr;
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use combd_kernel::limits;
use combd_kernel::settings::Settings;
use combd_kernel::sys;
use glommio::{LocalExecutorBuilder, Placement};

use crate::app::Apps;
use crate::shard::Shard;
use crate::stats::{self, NodeFigures, ShardStats};

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
    started: Instant,
    draining: AtomicBool,
}

impl NodeShared {
    /// Whether the node is draining for shutdown.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The node-wide figures of `/stats`.
    pub fn figures(&self) -> NodeFigures {
        NodeFigures {
            uptime_ms: self.started.elapsed().as_millis() as u64,
            max_conns_effective: self.max_conns_effective,
            draining: self.draining() as u64,
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
    events: mpsc::Receiver<(usize, ShardEvent)>,
    running: usize,
}

impl Node {
    /// Binds the listeners of every shard on `cpus[..settings.shards]` and starts the shards.
    /// Returns once every shard accepts connections.
    pub fn start(
        settings: Settings,
        apps: Apps,
        cpus: &[usize],
        max_conns_effective: u64,
    ) -> Result<Node, String> {
        let n = settings.shards;
        if cpus.len() < n {
            return Err(format!("{n} shards need {n} CPUs, {} allowed", cpus.len()));
        }
        // Bind every listener before any shard starts, so a port of 0 resolves once and every
        // shard (and the localhost listener) shares it.
        let mut public = Vec::with_capacity(n);
        let mut local = Vec::with_capacity(n);
        let mut addr = settings.listen;
        for i in 0..n {
            let p = sys::bind_listener(addr, limits::LISTEN_BACKLOG)
                .map_err(|e| format!("COMBD_LISTEN: cannot listen on {addr}: {e}"))?;
            if i == 0 {
                addr = p
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_socket())
                    .unwrap_or(addr);
            }
            let l_addr = SocketAddr::from(([127, 0, 0, 1], addr.port()));
            let l = sys::bind_listener(l_addr, limits::LISTEN_BACKLOG).map_err(|e| {
                format!("COMBD_LISTEN: cannot listen on {l_addr} (localhost listener): {e}")
            })?;
            public.push(p);
            local.push(l);
        }
        let local_addr = SocketAddr::from(([127, 0, 0, 1], addr.port()));
        let shared = Arc::new(NodeShared {
            settings,
            apps,
            stats: (0..n).map(|_| ShardStats::default()).collect(),
            max_conns_effective,
            started: Instant::now(),
            draining: AtomicBool::new(false),
        });
        let (tx, events) = mpsc::channel();
        for (id, (p, l)) in public.into_iter().zip(local).enumerate() {
            let for_shard = shared.clone();
            let tx = tx.clone();
            let (public_fd, local_fd) = (p.into_raw_fd(), l.into_raw_fd());
            let spawned = LocalExecutorBuilder::new(Placement::Fixed(cpus[id]))
                .name(&format!("combd-shard{id}"))
                .io_memory(limits::SHARD_IO_MEMORY_BYTES)
                .spawn(move || async move {
                    let ready = tx.clone();
                    let result = Shard::run(id, for_shard, public_fd, local_fd, move || {
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
