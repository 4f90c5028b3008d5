//! The apps built into the node. Each is registered by name at start-up.

use std::sync::Arc;

use combd_shards::app::{App, Apps};

pub mod counter;
pub mod echo;
pub mod hold;
pub mod limits;
pub mod million;
pub mod stall;

/// Every built-in app; the test apps too when `test_apps` is on.
pub fn builtin(test_apps: bool) -> Apps {
    let mut list: Vec<Arc<dyn App>> = vec![
        Arc::new(echo::Echo),
        Arc::new(counter::Counter),
        Arc::new(million::Million),
    ];
    if test_apps {
        list.push(Arc::new(hold::Hold));
        list.push(Arc::new(limits::Limits));
        list.push(Arc::new(stall::Stall));
    }
    let mut apps = Apps::new();
    for app in list {
        // Names are distinct by construction; a duplicate is a programming error at start-up.
        apps.register(app).expect("built-in app names are distinct");
    }
    apps
}
