//! How many object databases each app has on the node: counted once (at start-up, or when a
//! module deployed later is first asked about) from
//! `<data>/objects/<app>/*.sqlite`, then one more for each database the node creates. Nothing
//! removes an object's database, so the count only grows. A shard reserves a place before it
//! creates a database (one atomic per app), so shards creating at once cannot pass
//! `COMBD_MAX_OBJECTS_PER_APP` together.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::app::Apps;

/// The object databases of every app, against the most one app may have.
pub(crate) struct ObjectCounts {
    /// `COMBD_MAX_OBJECTS_PER_APP`.
    max: u64,
    data_dir: PathBuf,
    /// The registry: an app added while the node runs (a module deployed by SIGHUP) is
    /// counted from its directory when first asked about.
    registry: Apps,
    /// Each app's databases. An app removed keeps its count (its databases stay on disk).
    apps: RwLock<Vec<(&'static str, Arc<AtomicU64>)>>,
}

impl std::fmt::Debug for ObjectCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCounts")
            .field("max", &self.max)
            .finish()
    }
}

impl ObjectCounts {
    /// Counts the databases every app of `apps` has under `data_dir`.
    pub fn count(data_dir: &Path, apps: &Apps, max: u64) -> ObjectCounts {
        let counts = ObjectCounts {
            max,
            data_dir: data_dir.to_path_buf(),
            registry: apps.clone(),
            apps: RwLock::new(Vec::new()),
        };
        for app in apps.names() {
            counts.of(app);
        }
        counts
    }

    /// The count of `app`, counted from its directory the first time (`None`: no such app).
    fn of(&self, app: &str) -> Option<Arc<AtomicU64>> {
        let known = |apps: &[(&'static str, Arc<AtomicU64>)]| {
            apps.iter().find(|(a, _)| *a == app).map(|(_, n)| n.clone())
        };
        if let Some(n) = known(&self.apps.read().unwrap_or_else(|p| p.into_inner())) {
            return Some(n);
        }
        let name = self.registry.get(app)?.name();
        let mut apps = self.apps.write().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = known(&apps) {
            return Some(n);
        }
        let dir = self.data_dir.join("objects").join(name);
        let n = Arc::new(AtomicU64::new(databases_in(&dir)));
        apps.push((name, n.clone()));
        Some(n)
    }

    /// Takes a place for a new database of `app`; false when the app has the most it may (or
    /// is not registered).
    pub fn reserve(&self, app: &str) -> bool {
        self.of(app).is_some_and(|n| {
            n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v < self.max).then_some(v + 1)
            })
            .is_ok()
        })
    }

    /// Gives back a place taken by [`ObjectCounts::reserve`] for a database that was not
    /// created after all.
    pub fn release(&self, app: &str) {
        if let Some(n) = self.of(app) {
            n.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The databases `app` has (with the places reserved for ones being created).
    pub fn get(&self, app: &str) -> u64 {
        self.of(app).map_or(0, |n| n.load(Ordering::Acquire))
    }
}

/// The object databases in one app's directory: its `<name>.sqlite` files (not their `-wal`
/// and `-shm` sidecars). A directory that cannot be read holds none.
fn databases_in(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.len() > ".sqlite".len() && n.ends_with(".sqlite"))
        })
        .count() as u64
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::app::registry::tests::NameOnly;

    #[test]
    fn counts_databases_at_start_and_reserves_up_to_the_most() {
        let dir = std::env::temp_dir().join(format!("combd-counts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = dir.join("objects").join("a");
        std::fs::create_dir_all(&a).unwrap();
        for f in [
            "x.sqlite",
            "x.sqlite-wal",
            "x.sqlite-shm",
            "y.sqlite",
            "notes.txt",
        ] {
            std::fs::write(a.join(f), b"").unwrap();
        }
        let apps = Apps::new();
        apps.register(Arc::new(NameOnly("a"))).unwrap();
        apps.register(Arc::new(NameOnly("b"))).unwrap();
        let counts = ObjectCounts::count(&dir, &apps, 3);
        assert_eq!((counts.get("a"), counts.get("b")), (2, 0));
        assert!(counts.reserve("a"));
        assert!(!counts.reserve("a"), "a has 3, the most");
        assert!(counts.reserve("b"), "each app has its own count");
        counts.release("a");
        assert_eq!(counts.get("a"), 2);
        assert!(!counts.reserve("nope"), "an unknown app creates nothing");
        let c = dir.join("objects").join("c");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("z.sqlite"), b"").unwrap();
        apps.add(Arc::new(NameOnly("c"))).unwrap();
        assert_eq!(
            counts.get("c"),
            1,
            "an app added later is counted from its directory"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
