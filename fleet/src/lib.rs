//! combd's fleet clients: what a node needs to share its objects with other nodes.
//!
//! In a fleet (README.md, "The fleet") each object has one owner at a time, chosen at first
//! use and held by a lease in a coordinator (etcd); an object's committed batches are shipped to
//! a bucket (S3-compatible) as segments before their replies leave, fenced by the owner's
//! lease, so another node can restore every acknowledged write. A request for an object another
//! node owns is passed on to the owner, signed with the fleet key. This crate holds the parts
//! that do not depend on how a node runs (the node's side is `combd_shards::fleet`):
//!
//! - [`bucket`]: a minimal S3 client (put, get, delete, list), signed with SigV4 by `rusty-s3`
//!   (which does no I/O) and sent by `ureq` (blocking, every timeout and size bounded from
//!   `combd_kernel::limits`);
//! - [`coordinator`]: etcd v3 over its JSON gateway: one lease per node kept alive by a
//!   [`coordinator::LeaseKeeper`] thread, claiming an object (its fencing token is the owner
//!   key's `create_revision`), looking up its owner, and the fenced head advance that a stale
//!   owner cannot make;
//! - [`segment`]: packing a committed batch's WAL frames as a segment, and writing a database
//!   from a snapshot and the segments after it;
//! - [`ship`]: a segment uploaded, then the head advanced, fenced: what the commit task waits
//!   for before a batch's replies leave;
//! - [`restore`]: an object's database back from the bucket, following the chain of segments
//!   from the head the coordinator records;
//! - [`auth`]: the fleet key, and the MAC every request one node passes on to another carries,
//!   and the owner's answer too (checked before either is taken), with the replay stamps;
//! - [`forward`]: what the two sides of a request passed on agree on (the header that marks it
//!   forwarded, the client it was asked by, the fields the MAC leaves out).
//!
//! [`tls`] holds what an `https://` endpoint of etcd or the bucket is trusted by, and etcd's
//! client certificate. [`config`] turns the node's validated `COMBD_FLEET_*` settings into the
//! clients' configurations; `key_file` reads a key file a setting names (etcd's password, the
//! bucket's secret key, the fleet key, a client certificate's private key). [`keys`] names an object's files in the bucket (below).
//!
//! Nothing here runs on a glommio executor: every call blocks, so a shard runs it on a blocking
//! thread (`spawn_blocking`), as it does a WAL sync. The fleet is off unless `COMBD_FLEET_ETCD`
//! is set (`combd_kernel::settings::FleetSettings`); a node without it never calls this crate.
//!
//! ## Where an object lives in the bucket
//!
//! [`keys`] names them: `<object>/seg/<seq>-<token>` is segment `seq` written by the owner whose
//! fencing token is `token`; `<object>/snap/<seq>-<token>-<writer>` is a snapshot of the
//! database as of that segment, taken by the owner whose token is `writer`, and read only once
//! the coordinator records it (`coordinator::Coordinator::record_snapshot`, fenced like a head
//! advance). Putting the token in the key means a stale owner's upload can never overwrite
//! the real owner's object of the same number (S3 buckets such as Garage have no conditional
//! put). The head in the coordinator names the last segment and its token, each segment names
//! the token of the one before it, and [`restore`] follows that chain back from the head to a
//! snapshot (or to the beginning), so an orphan a stale owner uploaded is never read.
//!
//! ## How a node uses it (`combd_shards::fleet` and the objects' commit task)
//!
//! - At start, with the fleet on: read the secret ([`config::read_secret_key`]), grant the
//!   node's lease and start its [`coordinator::LeaseKeeper`].
//! - Opening an object (under `COMBD_RESTORES_AT_ONCE`): [`coordinator::Coordinator::claim`];
//!   if won, [`restore::restore_object`] from the head unless the local file is already at it;
//!   open it with `wal_autocheckpoint=0`; if held by another node, the request is passed on to
//!   that node ([`forward`]), and a WebSocket passed through to it.
//! - The commit task, after the group's WAL sync and before any reply: on a blocking thread,
//!   [`segment::WalCursor::next_segment`] until `None`, [`ship::ship_segment`] each; `Done`
//!   releases the replies if the keeper still holds the lease; `Fenced` refuses them and drops
//!   the object; an error refuses them (503, retry-after) and marks the pipeline failed. Then
//!   checkpoint, and now and then [`ship::ship_snapshot`] and delete the segments it covers.

#![forbid(unsafe_code)]

pub mod auth;
pub mod bucket;
pub mod config;
pub mod coordinator;
pub mod forward;
mod http;
mod key_file;
pub mod keys;
pub mod restore;
pub mod segment;
pub mod ship;
pub mod tls;

pub use http::Failure;
