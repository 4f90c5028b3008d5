//! The apps of a node, by name: the built-in ones, registered before the node starts, and
//! the modules, which a reload (SIGHUP) adds and removes while it runs.
//!
//! Every request looks its app up here, so an app removed is one no new request reaches (a
//! 404, `no such app`); the shards see the registry's generation change and close the
//! sessions of an app no longer in it (1001).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{valid_object_name, App};

/// The apps of a node, by name. Clones share one registry.
#[derive(Clone, Default)]
pub struct Apps {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    apps: RwLock<Vec<Arc<dyn App>>>,
    /// Bumped by every change while the node runs.
    generation: AtomicU64,
    /// Apps added and removed while the node runs, and additions refused.
    added: AtomicU64,
    removed: AtomicU64,
    add_refused: AtomicU64,
}

/// What changed in the registry while the node ran, for `/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changes {
    /// Apps added (modules that appeared).
    pub added: u64,
    /// Apps removed (modules that disappeared).
    pub removed: u64,
    /// Apps that could not be added (a module that failed to load, or took a built-in name).
    pub add_refused: u64,
}

impl Apps {
    /// No apps.
    pub fn new() -> Apps {
        Apps::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, Vec<Arc<dyn App>>> {
        // A panic while the list was written leaves it whole: each change is one push or
        // one remove.
        self.inner.apps.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Vec<Arc<dyn App>>> {
        self.inner.apps.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an app; a second app of the same name is refused.
    pub fn register(&self, app: Arc<dyn App>) -> Result<(), String> {
        if !valid_object_name(app.name()) {
            return Err(format!("app name {:?} is not a valid name", app.name()));
        }
        let mut apps = self.write();
        if apps.iter().any(|a| a.name() == app.name()) {
            return Err(format!("app {:?} registered twice", app.name()));
        }
        apps.push(app);
        Ok(())
    }

    /// Adds an app while the node runs (a module that appeared): requests reach it at once.
    pub fn add(&self, app: Arc<dyn App>) -> Result<(), String> {
        if let Err(e) = self.register(app) {
            self.add_refused();
            return Err(e);
        }
        self.inner.added.fetch_add(1, Ordering::Relaxed);
        self.inner.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Removes an app while the node runs (a module that disappeared): no new request reaches
    /// it, and the shards close its sessions when they next see [`Apps::generation`] change.
    pub fn remove(&self, name: &str) -> Option<Arc<dyn App>> {
        let removed = {
            let mut apps = self.write();
            let i = apps.iter().position(|a| a.name() == name)?;
            apps.remove(i)
        };
        self.inner.removed.fetch_add(1, Ordering::Relaxed);
        self.inner.generation.fetch_add(1, Ordering::Release);
        Some(removed)
    }

    /// The app of this name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn App>> {
        self.read().iter().find(|a| a.name() == name).cloned()
    }

    /// Whether an app of this name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.read().iter().any(|a| a.name() == name)
    }

    /// Every app's page: (path, HTML).
    pub fn pages(&self) -> Vec<(&'static str, &'static str)> {
        self.read().iter().filter_map(|a| a.page()).collect()
    }

    /// The names of every app.
    pub fn names(&self) -> Vec<&'static str> {
        self.read().iter().map(|a| a.name()).collect()
    }

    /// Changes since the node started: a shard that saw another number checks its sessions.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Counts an app that could not be added (a module that failed to load).
    pub fn add_refused(&self) {
        self.inner.add_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// What changed while the node ran.
    pub fn changes(&self) -> Changes {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Changes {
            added: n(&self.inner.added),
            removed: n(&self.inner.removed),
            add_refused: n(&self.inner.add_refused),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use crate::app::{AppError, Cx, Input, Output};

    /// An app that is only a name, for the tests of what registers apps.
    pub(crate) struct Named(pub &'static str);

    impl App for Named {
        fn name(&self) -> &'static str {
            self.0
        }
        fn handle(&self, _: &mut Cx<'_>, _: &Input<'_>) -> Result<Output, AppError> {
            Ok(Output::None)
        }
    }

    #[test]
    fn apps_added_and_removed_change_the_generation_and_are_counted() {
        let apps = Apps::new();
        apps.register(Arc::new(Named("counter"))).unwrap();
        assert_eq!(apps.generation(), 0);
        assert!(apps.register(Arc::new(Named("counter"))).is_err());
        assert!(apps.add(Arc::new(Named("bad/name"))).is_err());
        let shared = apps.clone();
        apps.add(Arc::new(Named("chat"))).unwrap();
        assert!(shared.contains("chat"), "clones share one registry");
        assert_eq!(shared.generation(), 1);
        assert!(apps.remove("nothing").is_none());
        assert_eq!(apps.generation(), 1);
        assert_eq!(apps.remove("chat").unwrap().name(), "chat");
        assert!(apps.get("chat").is_none());
        assert_eq!(apps.names(), vec!["counter"]);
        assert_eq!(apps.generation(), 2);
        let c = apps.changes();
        assert_eq!((c.added, c.removed, c.add_refused), (1, 1, 1));
    }
}
