//! Switches for tests only: nothing in the node or its settings sets them, and a node built
//! without the `testing` feature (a release build: only the test suite's dev-dependency turns
//! it on) has none: [`ack_before_sync`] is `false` and [`sync_wal`] only syncs.

#[cfg(feature = "testing")]
mod switches {
    use std::path::Path;
    use std::sync::atomic::AtomicBool;
    use std::sync::OnceLock;

    /// Answer a committed batch *before* its WAL sync, then sync: the broken durability the
    /// power-cut test (`tests/powercut.rs`) must catch. Read when an object starts.
    pub static ACK_BEFORE_SYNC: AtomicBool = AtomicBool::new(false);

    /// Runs each WAL sync the node makes (its path, and the sync itself): the power-cut tests'
    /// disk model learns through it which writes a sync covered, as its VFS does for SQLite's
    /// own syncs. Without one, a sync just runs.
    pub type WalSyncObserver = fn(&Path, &dyn Fn() -> std::io::Result<()>) -> std::io::Result<()>;

    /// The observer, set once for the process.
    pub static WAL_SYNC_OBSERVER: OnceLock<WalSyncObserver> = OnceLock::new();
}

#[cfg(feature = "testing")]
pub use switches::{WalSyncObserver, ACK_BEFORE_SYNC, WAL_SYNC_OBSERVER};

/// Whether a test asked for the broken order: answer, then sync.
pub(crate) fn ack_before_sync() -> bool {
    #[cfg(feature = "testing")]
    {
        ACK_BEFORE_SYNC.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(feature = "testing"))]
    {
        false
    }
}

/// Runs `sync`, the WAL sync of `path`, through a test's observer if one is set.
pub(crate) fn sync_wal(
    path: &std::path::Path,
    sync: &dyn Fn() -> std::io::Result<()>,
) -> std::io::Result<()> {
    #[cfg(feature = "testing")]
    if let Some(observe) = WAL_SYNC_OBSERVER.get() {
        return observe(path, sync);
    }
    let _ = path;
    sync()
}
