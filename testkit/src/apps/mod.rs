//! The test apps: each crosses one of the node's limits or paths on purpose (a request that
//! holds its object or the shard's loop, a broadcast of N frames to K topics, a call past its
//! memory or SQL limits, alarms, messages between objects, what a caller and an identified
//! client look like to an app). `combd-test-node` registers them beside the built-in apps;
//! the `combd` binary never does.

use std::sync::Arc;

use combd_shards::app::{App, Apps};

pub mod alarmer;
pub mod bank;
pub mod brief;
pub mod caller;
pub mod fanout;
pub mod hold;
pub mod kv;
pub mod limits;
pub mod room;
pub mod stall;
pub mod whoami;

/// The value of `key` in a query string (`a=1&b=2`), for the test apps' parameters.
pub(crate) fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// Registers every test app in `apps` (beside the built-in apps, before any module).
pub fn register(apps: &Apps) {
    let list: [Arc<dyn App>; 11] = [
        Arc::new(fanout::Fanout),
        Arc::new(hold::Hold),
        Arc::new(limits::Limits),
        Arc::new(stall::Stall),
        Arc::new(whoami::WhoAmI),
        Arc::new(caller::CallerApp),
        Arc::new(alarmer::Alarmer),
        Arc::new(bank::Bank),
        Arc::new(room::Room),
        Arc::new(brief::Brief),
        Arc::new(kv::Kv),
    ];
    for app in list {
        // The names are distinct from each other and from the built-in apps': a duplicate is
        // a programming error at start-up.
        apps.register(app)
            .expect("test app names are distinct from the built-in apps'");
    }
}
