//! The node's upload threads: they upload every object's segments (several groups of one
//! object at once, so a bucket's latency costs latency, not throughput) and delete what a
//! snapshot replaced, off the shards' blocking threads.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use combd_fleet::bucket::Bucket;
use combd_fleet::coordinator::Snapshot;
use combd_fleet::segment::Segment;
use combd_fleet::ship;

use super::FleetStats;

/// Work for the upload threads.
pub(super) enum Upload {
    /// A group's segments on their way to the bucket, and where to say they are there.
    Segments {
        segments: Vec<Segment>,
        done: async_channel::Sender<Result<Vec<Segment>, String>>,
    },
    /// An object's snapshot `kept` is in the bucket and recorded: delete what it replaces.
    Prune { object: String, kept: Snapshot },
}

/// An upload thread: uploads (and prunes) what it is given until the node's fleet is dropped.
pub(super) fn upload_thread(
    bucket: Bucket,
    stats: Arc<FleetStats>,
    jobs: async_channel::Receiver<Upload>,
) {
    while let Ok(job) = jobs.recv_blocking() {
        let (segments, done) = match job {
            Upload::Segments { segments, done } => (segments, done),
            Upload::Prune { object, kept } => {
                match ship::prune(&bucket, &object, kept) {
                    Ok(n) => {
                        stats.pruned_keys.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        stats.prune_failed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%object, "cannot delete the segments a snapshot replaced: {e}");
                    }
                }
                continue;
            }
        };
        let mut result = Ok(());
        for segment in &segments {
            let started = Instant::now();
            if let Err(e) = ship::upload_segment(&bucket, segment) {
                result = Err(e.to_string());
                break;
            }
            stats.segments_uploaded.fetch_add(1, Ordering::Relaxed);
            stats.upload_took(started.elapsed().as_micros() as u64);
        }
        let _ = done.try_send(result.map(|()| segments));
    }
}
