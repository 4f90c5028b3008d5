//! The apps built into the node. Each is registered by name at start-up.

use std::sync::Arc;

use combd_shards::app::Apps;

pub mod echo;

/// Every built-in app.
pub fn builtin() -> Apps {
    let mut apps = Apps::new();
    let builtins: Vec<Arc<dyn combd_shards::app::App>> = vec![Arc::new(echo::Echo)];
    for app in builtins {
        // Names are distinct by construction; a duplicate is a programming error at start-up.
        apps.register(app).expect("built-in app names are distinct");
    }
    apps
}
