//! The apps built into the node. Each is registered by name at start-up.

use std::sync::Arc;

use combd_shards::app::{App, Apps};

pub mod alarmer;
pub mod bank;
pub mod caller;
pub mod chat;
pub mod counter;
pub mod echo;
pub mod fanout;
pub mod hold;
pub mod limits;
pub mod million;
pub mod reminder;
pub mod stall;
pub mod whoami;

/// The value of `key` in a query string (`a=1&b=2`), for the test apps' parameters.
pub(crate) fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// Every built-in app; the test apps too when `test_apps` is on.
pub fn builtin(test_apps: bool) -> Apps {
    let mut list: Vec<Arc<dyn App>> = vec![
        Arc::new(echo::Echo),
        Arc::new(counter::Counter),
        Arc::new(million::Million),
        Arc::new(chat::Chat),
        Arc::new(reminder::Reminder),
    ];
    if test_apps {
        list.push(Arc::new(fanout::Fanout));
        list.push(Arc::new(hold::Hold));
        list.push(Arc::new(limits::Limits));
        list.push(Arc::new(stall::Stall));
        list.push(Arc::new(whoami::WhoAmI));
        list.push(Arc::new(caller::CallerApp));
        list.push(Arc::new(alarmer::Alarmer));
        list.push(Arc::new(bank::Bank));
    }
    let apps = Apps::new();
    for app in list {
        // Names are distinct by construction; a duplicate is a programming error at start-up.
        apps.register(app).expect("built-in app names are distinct");
    }
    apps
}
