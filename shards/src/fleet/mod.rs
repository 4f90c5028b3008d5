//! The fleet, when `COMBD_FLEET_ETCD` is set: this node's lease in the coordinator, and what
//! its objects do with it (README.md, "The fleet"; the clients are the `combd-fleet` crate).
//!
//! - **Opening an object** ([`Fleet::open`]): claim it in the coordinator (the first node
//!   asked for an unowned object owns it); if this node owns it, write its database from the
//!   bucket (snapshot + segments, up to the head the coordinator records) before SQLite opens
//!   it; if another node owns it, the object is not served here.
//! - **Before a batch's answers leave**: the WAL frames committed since the last group was cut
//!   become segments ([`Fleet::cut`]), uploaded on the node's upload threads
//!   ([`Fleet::upload`], several groups of one object at once), and then, in commit order, the
//!   group's last segment is made the head by a transaction that checks this node's fencing
//!   token, and this node's lease must still hold ([`Fleet::advance`]). Otherwise nothing of
//!   the group (or of the groups after it) is answered.
//! - **A checkpoint** ([`Fleet::snapshot`]): once everything committed is shipped, the WAL is
//!   checkpointed and the database uploaded as a snapshot at the head, so a restore reads one
//!   file and the segments after it.
//!
//! [`Fleet`] holds its parts, each with its own state, in its own file: this node's lease
//! (`lease`: granted, kept, replaced when lost), the fleet key's trust (`trust`: checking what
//! other nodes pass on, signing what this node passes on), passing on to owners ([`PassOn`],
//! `pass_on`), the wake index's sweeps ([`WakeSweep`], `wakes`), snapshots (`snapshot`), and
//! its figures ([`FleetStats`], `stats`). One object's open in progress is an `Opening`
//! (`open`). The methods that connections call stay [`Fleet`]'s.
//!
//! Every call here but [`Fleet::upload`] blocks (HTTP to etcd and the bucket): the shard runs
//! them on a blocking thread, like a WAL sync.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use combd_fleet::auth;
use combd_fleet::bucket::Bucket;
use combd_fleet::config;
use combd_fleet::coordinator::{Advance, Coordinator, DueChange, Head};
use combd_fleet::segment::{Segment, WalCursor};
use combd_fleet::tls::FleetTls;
use combd_kernel::limits::FLEET_UPLOAD_THREADS;
use combd_kernel::settings::{parse_fleet_address, FleetSettings};

mod at_head;
mod client;
pub(crate) use client::kept_in_answer;
mod identity;
mod lease;
mod open;
mod pass_on;
mod snapshot;
mod stats;
mod trust;
mod unreachable;
mod upload;
mod wakes;

use lease::NodeLease;
use open::Opening;
pub use pass_on::{owner_unreachable, PassOn, MESSAGE_PATH};
use snapshot::Snapshots;
pub use stats::FleetStats;
pub use trust::auth_refused;
pub(crate) use trust::Trust;
pub use unreachable::{Attempt, Failed};
use upload::{upload_thread, Upload};
pub use wakes::WakeSweep;

/// Where the fleet's keys live in the coordinator.
const KEY_PREFIX: &str = "combd/";

/// This node's part of the fleet.
pub struct Fleet {
    bucket: Bucket,
    coordinator: Arc<Coordinator>,
    /// The lease this node holds now.
    lease: NodeLease,
    /// The fleet key's checks of what other nodes pass on (connections call its
    /// `authenticate`), and its signatures.
    pub(crate) trust: Trust,
    /// Whether a fleet address may be public (`COMBD_FLEET_NODE_PUBLIC`).
    node_public: bool,
    /// Passing requests and messages on to other nodes' objects.
    pub pass_on: PassOn,
    /// The sweeps of the fleet's wake index.
    pub wakes: WakeSweep,
    /// Snapshots, and the pruning of what they replace.
    snapshots: Snapshots,
    /// Segments to upload, taken by the node's upload threads.
    uploads: async_channel::Sender<Upload>,
    /// This node's fleet address, recorded as the owner of what it claims.
    node: String,
    /// The node's fleet figures.
    pub stats: Arc<FleetStats>,
}

/// Why an object cannot be served here.
#[derive(Debug)]
pub enum OpenError {
    /// Another node owns it (its fleet address).
    Elsewhere(String),
    /// The coordinator or the bucket failed, or this node's lease is gone.
    Unavailable(String),
}

/// What an owned object ships from: its WAL, how far it was read, and the head.
#[derive(Debug)]
pub struct Shipping {
    key: String,
    wal: PathBuf,
    cursor: WalCursor,
    /// This node's fencing token for the object.
    token: i64,
    /// The lease the object was claimed under: it is served only while that lease holds.
    lease: i64,
    /// The head: the last segment shipped, and the token that wrote it.
    head: Head,
    /// The last segment cut from the WAL (at or past the head: those after it are on their
    /// way).
    cut: Head,
    /// The head of the newest snapshot of the object in the bucket that this node knows of:
    /// a snapshot at the head again would upload the same database.
    snapshot_at: Option<Head>,
    /// When the object next has something due, as the coordinator records it (the fleet's
    /// wake index, `combd_fleet::coordinator` `wakes`): moved with the head that changes it.
    due: Option<u64>,
}

impl Shipping {
    /// An object opened at `head`, claimed with fencing token `token` under lease `lease`, its
    /// WAL at `wal` starting over, and the newest snapshot known at `snapshot_at`.
    fn from(
        key: &str,
        wal: PathBuf,
        token: i64,
        lease: i64,
        head: Head,
        snapshot_at: Option<Head>,
    ) -> Shipping {
        Shipping {
            key: key.to_string(),
            wal,
            cursor: WalCursor::new(),
            token,
            lease,
            head,
            cut: head,
            snapshot_at,
            due: None,
        }
    }
}

/// What a shipment came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Shipped {
    /// Every committed batch is in the bucket and this node still owns the object.
    Done,
    /// Another node owns the object now: nothing may be answered; the object must go.
    Fenced,
    /// The bucket or the coordinator failed, or the lease is gone: nothing may be answered.
    Failed(String),
}

/// The coordinator's client: over TLS with the client certificate where configured, as the
/// etcd user where there is one (authenticated now, so a wrong password fails start-up).
fn coordinator(settings: &FleetSettings) -> Result<Coordinator, (&'static str, String)> {
    let client = settings
        .etcd_client_cert
        .as_ref()
        .map(|(c, k)| (c.as_path(), k.as_path()));
    let mut c = Coordinator::new(&settings.etcd, KEY_PREFIX)
        .with_tls(&FleetTls::from_files(settings.ca_file.as_deref(), client)?);
    if let Some((name, file)) = &settings.etcd_user {
        let password = config::read_etcd_password(file)
            .map_err(|e| ("COMBD_FLEET_ETCD_PASSWORD_FILE", e.message))?;
        c = c.with_user(name, &password);
        c.authenticate()
            .map_err(|e| ("COMBD_FLEET_ETCD_USER", format!("{name:?}: {e}")))?;
    }
    Ok(c)
}

impl Fleet {
    /// Reads the secret, grants this node's lease and starts keeping it. Errors name the
    /// setting to look at.
    pub fn start(settings: &FleetSettings) -> Result<Fleet, (&'static str, String)> {
        let secret = config::read_secret_key(&settings.secret_key_file)
            .map_err(|e| ("COMBD_FLEET_SECRET_KEY_FILE", e.message))?;
        let key = Arc::new(
            auth::read_fleet_key(&settings.key_file)
                .map_err(|e| ("COMBD_FLEET_KEY_FILE", e.message))?,
        );
        let bucket = Bucket::new(&config::bucket_config(settings, secret))
            .map_err(|e| ("COMBD_FLEET_BUCKET_URL", e.to_string()))?
            .with_tls(&FleetTls::from_files(settings.ca_file.as_deref(), None)?)
            .with_fleet_key(key.clone());
        let coordinator = Arc::new(coordinator(settings)?);
        let id = identity::check(&coordinator, &bucket)?;
        tracing::info!(fleet = %id, "this node is of fleet {id}");
        let stats = Arc::new(FleetStats::default());
        let lease = NodeLease::grant(coordinator.clone(), settings.lease_ttl, stats.clone())
            .map_err(|e| ("COMBD_FLEET_ETCD", e))?;
        let (uploads, jobs) = async_channel::unbounded();
        for i in 0..FLEET_UPLOAD_THREADS {
            let (bucket, stats, jobs) = (bucket.clone(), stats.clone(), jobs.clone());
            std::thread::Builder::new()
                .name(format!("combd-upload-{i}"))
                .spawn(move || upload_thread(bucket, stats, jobs))
                .map_err(|e| {
                    (
                        "COMBD_FLEET_BUCKET_URL",
                        format!("cannot start an upload thread: {e}"),
                    )
                })?;
        }
        let node = settings.node.to_string();
        Ok(Fleet {
            snapshots: Snapshots::new(
                bucket.clone(),
                coordinator.clone(),
                uploads.clone(),
                stats.clone(),
            ),
            bucket,
            lease,
            trust: Trust::new(key.clone(), node.clone(), stats.clone()),
            node_public: settings.node_public,
            pass_on: PassOn::new(key, stats.clone()),
            wakes: WakeSweep::new(coordinator.clone(), stats.clone()),
            coordinator,
            uploads,
            node,
            stats,
        })
    }

    /// Gives this node's lease back (the node stopped, its objects let go and snapshotted), so
    /// its objects can be claimed at once instead of after the lease's TTL. Blocking.
    pub fn release(&self) {
        self.lease.release();
    }

    /// Whether this node's lease holds now.
    pub fn holds(&self) -> bool {
        self.lease.holds()
    }

    /// This node's lease now: its id, and whether it holds.
    pub fn lease_now(&self) -> (i64, bool) {
        (self.lease.lease().id, self.lease.holds())
    }

    /// The fleet's figures for `/stats` and `/metrics`, in a fixed order (all zero but the
    /// lease's on a node alone): [`stats::figures`].
    pub fn figures(fleet: Option<&Fleet>) -> Vec<crate::stats::Field> {
        let seen = fleet.map(|f| stats::FleetNow {
            stats: &f.stats,
            holds: f.holds(),
            replays_held: f.trust.replays_held() as u64,
            bucket_retries: f.bucket.retries(),
        });
        stats::figures(seen.as_ref())
    }

    /// Claims object `key` and, if this node owns it, writes its database at `path` from the
    /// bucket (the local files are replaced: the bucket holds every acknowledged write), or
    /// keeps the file a clean close left at the head ([`Opening`]). Blocking.
    pub fn open(&self, key: &str, path: &Path) -> Result<Shipping, OpenError> {
        Opening::claim(self, key, path)?.open()
    }

    /// Forgets `s`'s object, deleted (its database marked, and its last batch shipped): its head,
    /// snapshot and due time go from etcd and its tombstone is written (fenced on this node's
    /// token: the decision), then every segment and snapshot of it goes from the bucket, then
    /// its tombstone (and with `release` this node's claim). A node that dies in the middle
    /// leaves the tombstone, and the object's next owner finishes ([`Fleet::finish_forget`])
    /// before it serves it as new. `s` goes on as a new object's (nothing shipped). Blocking.
    pub fn forget(&self, s: &mut Shipping, release: bool) -> Result<(), String> {
        let fenced = || "another node owns the object now".to_string();
        match self.coordinator.forget(&s.key, s.token, s.due) {
            Ok(Advance::Done) => {}
            Ok(Advance::Fenced) => return Err(fenced()),
            Err(e) => return Err(e.to_string()),
        }
        self.finish_forget(&s.key, s.token, release)?;
        self.stats.objects_forgotten.fetch_add(1, Ordering::Relaxed);
        let head = Head {
            seq: 0,
            token: s.token,
        };
        *s = Shipping::from(&s.key, s.wal.clone(), s.token, s.lease, head, None);
        Ok(())
    }

    /// The second half of [`Fleet::forget`]: the bucket cleared of the object, then its
    /// tombstone taken away (and its claim, with `release`). Blocking.
    pub(crate) fn finish_forget(&self, key: &str, token: i64, release: bool) -> Result<(), String> {
        combd_fleet::ship::clear(&self.bucket, key).map_err(|e| e.to_string())?;
        match self.coordinator.forgotten(key, token, release) {
            Ok(Advance::Done) => {
                if release {
                    self.stats.claims_released.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            Ok(Advance::Fenced) => Err("another node owns the object now".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Gives back the claim of `s`'s object if it was never written: nothing shipped (no
    /// head, nothing cut) and no database file made at `path` (its reads ran on a scratch
    /// database). Then nothing of it stays in etcd (its owner key deleted, fenced on this
    /// node's token), so a spray of names leaves nothing behind. Returns whether the object was
    /// unwritten. Blocking.
    pub fn release_if_unwritten(&self, s: &Shipping, path: &Path) -> bool {
        if s.head.seq != 0 || s.cut.seq != 0 || path.exists() {
            return false;
        }
        match self.coordinator.release(&s.key, s.token) {
            Ok(Advance::Done) => {
                self.stats.claims_released.fetch_add(1, Ordering::Relaxed);
            }
            // Another node owns it already: nothing of this node's is left.
            Ok(Advance::Fenced) => {}
            // The claim lapses with this node's lease instead.
            Err(e) => tracing::warn!(object = %s.key, "cannot give the claim back: {e}"),
        }
        true
    }

    /// Checkpoints the database (everything committed must be shipped already) and uploads it
    /// as the snapshot at the head, so a restore starts from it ([`Snapshots`]). Blocking.
    pub fn snapshot(
        &self,
        s: &mut Shipping,
        db: &rusqlite::Connection,
        path: &Path,
    ) -> Result<(), String> {
        self.snapshots.take(s, db, path, &self.lease)
    }

    /// After a clean close (everything committed shipped, snapshotted at the head, the
    /// database closed): marks the local file as the head's database, so the next open here
    /// at the same head restores nothing. Blocking.
    pub fn left_at_head(&self, s: &Shipping, path: &Path) {
        self.snapshots.left_at_head(s, path);
    }

    /// Whether to try reaching `owner` now ([`PassOn::may_try`]).
    pub fn may_try(&self, owner: &str) -> Option<Attempt> {
        self.pass_on.may_try(owner)
    }

    /// `owner` answered.
    pub fn owner_reached(&self, owner: &str) {
        self.pass_on.owner_reached(owner);
    }

    /// `attempt` of `owner` failed `how`.
    pub fn owner_failed(&self, owner: &str, attempt: Attempt, how: Failed) {
        self.pass_on.owner_failed(owner, attempt, how);
    }

    /// Who owns `key`, read from the coordinator (a read, no claim): another node's fleet
    /// address if it holds the object under a live lease (a lapsed lease's claim is gone from
    /// etcd), else `None` (unowned, this node's, unreadable, or an owner value that is not a
    /// fleet address): the object's cell claims it then, and meets the same answers. Blocking.
    /// A node whose lease is gone asks for a new one here too, as at an open (at most once a
    /// [`FLEET_LEASE_REGRANT_INTERVAL`]).
    pub fn lookup(&self, key: &str) -> Option<String> {
        self.stats.lookups.fetch_add(1, Ordering::Relaxed);
        self.lease.regrant_if_lost();
        match self.coordinator.owner(key) {
            Ok(Some(owner)) if owner.node != self.node => {
                match parse_fleet_address(&owner.node, self.node_public) {
                    Ok(_) => Some(owner.node),
                    Err(_) => None,
                }
            }
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(object = %key, "cannot read the owner: {e}");
                None
            }
        }
    }

    /// A request or attach passed on to its object's owner without a cell (`cells::route`).
    pub fn count_routed(&self) {
        self.stats.routed.fetch_add(1, Ordering::Relaxed);
    }

    /// The object is let go (closed here): it no longer counts as owned. Its claim lapses with
    /// this node's lease, or stays this node's while the lease lives.
    pub fn closed(&self) {
        self.stats.objects_owned.fetch_sub(1, Ordering::Relaxed);
    }

    /// Cuts every transaction committed up to `wal_len` bytes into the WAL into segments,
    /// numbered after the last one cut (the head may not have reached it yet: those before are
    /// still on their way). Blocking (reads the WAL).
    pub fn cut(&self, s: &mut Shipping, wal_len: u64) -> Result<Vec<Segment>, String> {
        let mut segments = Vec::new();
        loop {
            let next = s.cut.seq + 1;
            match s
                .cursor
                .next_segment_upto(&s.wal, &s.key, next, s.token, s.cut.token, wal_len)
            {
                Ok(Some(segment)) => segments.push(segment),
                Ok(None) => return Ok(segments),
                Err(e) => return Err(e.to_string()),
            }
            s.cut = Head {
                seq: next,
                token: s.token,
            };
        }
    }

    /// Uploads `segments` on the node's upload threads; the answer comes on the channel.
    /// `answers` counts as waiting for an upload until [`Fleet::advance`] (or the caller)
    /// says it is over.
    pub fn upload(
        &self,
        segments: Vec<Segment>,
        answers: usize,
    ) -> async_channel::Receiver<Result<Vec<Segment>, String>> {
        self.stats
            .acks_waiting_upload
            .fetch_add(answers as u64, Ordering::Relaxed);
        let (tx, rx) = async_channel::bounded(1);
        if let Err(e) = self
            .uploads
            .try_send(Upload::Segments { segments, done: tx })
        {
            // Never full (unbounded) and never closed while the node runs.
            if let Upload::Segments { done, .. } = e.into_inner() {
                let _ = done.try_send(Err("the upload threads are gone".into()));
            }
        }
        rx
    }

    /// A group's answers no longer wait for an upload (shipped, or refused).
    pub fn uploaded(&self, answers: usize) {
        self.stats
            .acks_waiting_upload
            .fetch_sub(answers as u64, Ordering::Relaxed);
    }

    /// Makes the last of `segments` (uploaded, and every segment cut before them already the
    /// head) the object's head, fenced by this node's token, then checks the lease. `due`: when
    /// the object next has something due as of the group's last batch that changed it (if
    /// one did), recorded in the fleet's wake index in the same transaction. Blocking.
    pub fn advance(
        &self,
        s: &mut Shipping,
        segments: &[Segment],
        due: Option<Option<u64>>,
    ) -> Shipped {
        let head = segments.last().map(|last| Head {
            seq: last.seq,
            token: last.token,
        });
        let change = DueChange {
            was: s.due,
            now: due.unwrap_or(s.due),
        };
        let shipped = if head.is_none() && change.was == change.now {
            Shipped::Done
        } else {
            match self
                .coordinator
                .advance_head_and_due(&s.key, s.token, head, change)
            {
                Ok(Advance::Done) => {
                    if let Some(head) = head {
                        s.head = head;
                    }
                    s.due = change.now;
                    Shipped::Done
                }
                Ok(Advance::Fenced) => Shipped::Fenced,
                Err(e) => Shipped::Failed(e.to_string()),
            }
        };
        let shipped = match shipped {
            Shipped::Done if !self.lease.holds_lease(s.lease) => {
                Shipped::Failed("this node's lease is gone".into())
            }
            other => other,
        };
        match &shipped {
            Shipped::Done => {}
            Shipped::Fenced => {
                self.stats.ship_fenced.fetch_add(1, Ordering::Relaxed);
            }
            Shipped::Failed(_) => {
                self.stats.ship_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        shipped
    }

    /// A shipment that failed before its head advance (the WAL could not be read, or the
    /// upload failed).
    pub fn ship_failed(&self) {
        self.stats.ship_failed.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) use crate::object_files::sidecar;
