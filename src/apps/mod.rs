//! The apps built into the node, the ones a user runs. Each is registered by name at start-up.
//! The test apps are not here: `combd-testkit` holds them, and only the `combd-test-node`
//! binary serves them.

use std::sync::Arc;

use combd_shards::app::{App, Apps};

pub mod chat;
pub mod counter;
pub mod echo;
pub mod million;
pub mod reminder;

/// Every built-in app.
pub fn builtin() -> Apps {
    let list: [Arc<dyn App>; 5] = [
        Arc::new(echo::Echo),
        Arc::new(counter::Counter),
        Arc::new(million::Million),
        Arc::new(chat::Chat),
        Arc::new(reminder::Reminder),
    ];
    let apps = Apps::new();
    for app in list {
        // Names are distinct by construction; a duplicate is a programming error at start-up.
        apps.register(app).expect("built-in app names are distinct");
    }
    apps
}
