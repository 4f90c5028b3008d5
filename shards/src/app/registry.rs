//! The apps of a node, by name: the built-in ones, registered before the node starts, and
//! the modules, which a reload (SIGHUP) adds and removes while it runs.
//!
//! Every request looks its app up here, so an app removed is one no new request reaches (a
//! 404, `no such app`); the shards see the registry's generation change and close the
//! sessions of an app no longer in it (1001).
//!
//! Nothing here is shared on the request path: each thread (each shard) looks apps up in its
//! own copy of the list ([`Copy`]), taken again only when the registry's version (one atomic
//! load) says it changed. The lock is taken by changes, and by a thread's first lookup after
//! one.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{valid_object_name, App};

/// The apps of a node, by name. Clones share one registry.
#[derive(Clone, Default)]
pub struct Apps {
    inner: Arc<Inner>,
}

struct Inner {
    /// This registry's number: no other registry of the process has it.
    id: u64,
    apps: RwLock<Vec<Arc<dyn App>>>,
    /// Bumped by every change of `apps` (a registration before the node starts too), after it:
    /// a thread's [`Copy`] of another version is stale.
    version: AtomicU64,
    /// Bumped by every change while the node runs.
    generation: AtomicU64,
    /// Apps added and removed while the node runs, and additions refused.
    added: AtomicU64,
    removed: AtomicU64,
    add_refused: AtomicU64,
}

/// Why an app was not registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterError {
    /// Its name is not a valid name (`app::valid_object_name`).
    BadName(&'static str),
    /// An app of its name is registered.
    Taken(&'static str),
}

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegisterError::BadName(name) => write!(f, "app name {name:?} is not a valid name"),
            RegisterError::Taken(name) => write!(f, "app {name:?} registered twice"),
        }
    }
}

impl std::error::Error for RegisterError {}

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

/// The next registry's id.
static REGISTRIES: AtomicU64 = AtomicU64::new(1);

impl Default for Inner {
    fn default() -> Inner {
        Inner {
            id: REGISTRIES.fetch_add(1, Ordering::Relaxed),
            apps: RwLock::default(),
            version: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            added: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            add_refused: AtomicU64::new(0),
        }
    }
}

/// A thread's copy of a registry's list: the registry's id, the version it was taken at, and
/// the apps.
struct Copy {
    id: u64,
    version: u64,
    apps: Rc<[Arc<dyn App>]>,
}

thread_local! {
    /// This thread's (shard's) copy of the registry it last looked in.
    static COPY: RefCell<Option<Copy>> = const { RefCell::new(None) };
}

impl Apps {
    /// No apps.
    pub fn new() -> Apps {
        Apps::default()
    }

    /// The apps, from this thread's copy; taken again if the registry changed since.
    fn local(&self) -> Rc<[Arc<dyn App>]> {
        let version = self.inner.version.load(Ordering::Acquire);
        COPY.with(|c| {
            let mut c = c.borrow_mut();
            match &*c {
                Some(copy) if copy.id == self.inner.id && copy.version == version => {
                    copy.apps.clone()
                }
                _ => {
                    let apps: Rc<[Arc<dyn App>]> = self.read().iter().cloned().collect();
                    *c = Some(Copy {
                        id: self.inner.id,
                        version,
                        apps: apps.clone(),
                    });
                    apps
                }
            }
        })
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
    pub fn register(&self, app: Arc<dyn App>) -> Result<(), RegisterError> {
        if !valid_object_name(app.name()) {
            return Err(RegisterError::BadName(app.name()));
        }
        let mut apps = self.write();
        if apps.iter().any(|a| a.name() == app.name()) {
            return Err(RegisterError::Taken(app.name()));
        }
        apps.push(app);
        self.inner.version.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Adds an app while the node runs (a module that appeared): requests reach it at once.
    pub fn add(&self, app: Arc<dyn App>) -> Result<(), RegisterError> {
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
            let removed = apps.remove(i);
            self.inner.version.fetch_add(1, Ordering::Release);
            removed
        };
        self.inner.removed.fetch_add(1, Ordering::Relaxed);
        self.inner.generation.fetch_add(1, Ordering::Release);
        Some(removed)
    }

    /// The app of this name (from this thread's copy).
    pub fn get(&self, name: &str) -> Option<Arc<dyn App>> {
        self.local().iter().find(|a| a.name() == name).cloned()
    }

    /// Whether an app of this name is registered (in this thread's copy).
    pub fn contains(&self, name: &str) -> bool {
        self.local().iter().any(|a| a.name() == name)
    }

    /// Every app's page: (path, HTML).
    pub fn pages(&self) -> Vec<(&'static str, &'static str)> {
        self.local().iter().filter_map(|a| a.page()).collect()
    }

    /// The names of every app.
    pub fn names(&self) -> Vec<&'static str> {
        self.local().iter().map(|a| a.name()).collect()
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
    pub(crate) struct NameOnly(pub &'static str);

    impl App for NameOnly {
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
        apps.register(Arc::new(NameOnly("counter"))).unwrap();
        assert_eq!(apps.generation(), 0);
        let twice = apps.register(Arc::new(NameOnly("counter")));
        assert_eq!(twice, Err(RegisterError::Taken("counter")));
        assert_eq!(
            twice.unwrap_err().to_string(),
            "app \"counter\" registered twice"
        );
        let bad = apps.add(Arc::new(NameOnly("bad/name")));
        assert_eq!(bad, Err(RegisterError::BadName("bad/name")));
        let shared = apps.clone();
        apps.add(Arc::new(NameOnly("chat"))).unwrap();
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

    #[test]
    fn each_threads_copy_follows_changes_made_on_another() {
        let apps = Apps::new();
        apps.register(Arc::new(NameOnly("counter"))).unwrap();
        // This thread's copy, of this registry.
        assert!(apps.get("counter").is_some());
        // Another registry on the same thread is not answered from that copy.
        let other = Apps::new();
        assert!(other.get("counter").is_none());
        assert!(apps.contains("counter"));
        let shared = apps.clone();
        let (copied, copied_rx) = std::sync::mpsc::channel();
        let (changed, changed_rx) = std::sync::mpsc::channel::<()>();
        let shard = std::thread::spawn(move || {
            assert!(shared.get("counter").is_some(), "its first copy");
            copied.send(()).unwrap();
            // Changed on the main thread meanwhile: its copy is taken again.
            changed_rx.recv().unwrap();
            (
                shared.get("chat").is_some(),
                shared.get("counter").is_some(),
            )
        });
        copied_rx.recv().unwrap();
        apps.add(Arc::new(NameOnly("chat"))).unwrap();
        apps.remove("counter").unwrap();
        changed.send(()).unwrap();
        assert_eq!(shard.join().unwrap(), (true, false));
    }
}
