//! A message between objects that another node of the fleet passes on to this one, the
//! receiver's owner (`crate::fleet` `pass_message`): `POST /_fleet/message/<app>/<name>
//! ?from=<app>/<name>&id=<id>`, routed only when signed by the fleet (the fleet key's MAC covers
//! the target and the body; no node passes a client's request on to this path, so a client
//! cannot make one). It goes to the receiver's mailbox as the sender's message, taken exactly
//! once like one from this node.

use std::sync::Arc;

use combd_kernel::limits::OBJECT_MESSAGE_MAX_BYTES;

use crate::app::{valid_object_name, App, Apps};
use crate::fleet::MESSAGE_PATH;
use crate::http::{Request, Response};
use crate::object_key::ObjectKey;

/// A message passed on by the fleet, for its receiver.
pub(super) struct Passed {
    /// The receiver's app and name.
    pub app: Arc<dyn App>,
    pub name: String,
    /// The sender (`app/name`) and its outbox id of the message.
    pub sender: (ObjectKey, i64),
}

/// The sender (`app/name`) and its outbox id of a message's `?from=<app>/<name>&id=<id>`.
fn sender(query: Option<&str>) -> Option<(ObjectKey, i64)> {
    let (mut from, mut id) = (None, None);
    for pair in query?.split('&') {
        match pair.split_once('=') {
            Some(("from", v)) => from = Some(v),
            Some(("id", v)) => id = v.parse::<i64>().ok().filter(|id| *id > 0),
            _ => return None,
        }
    }
    let from = ObjectKey::parse(from?)?;
    let (app, name) = (from.app(), from.name());
    let app_ok = !app.is_empty()
        && app.len() <= 64
        && app
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    (app_ok && valid_object_name(name)).then_some((from, id?))
}

/// Where a message passed on by the fleet goes (`path` under [`MESSAGE_PATH`]), among `apps`;
/// else the refusal to answer it with.
pub(super) fn route(apps: &Apps, req: &Request<'_>, path: &str) -> Result<Passed, Response> {
    if req.method != "POST" {
        return Err(Response::error(405, "method not allowed").with_header("allow", "POST"));
    }
    let Some((app, name)) = path[MESSAGE_PATH.len()..].split_once('/') else {
        return Err(Response::error(404, "not found"));
    };
    let Some(app) = apps.get(app) else {
        return Err(Response::error(404, "no such app"));
    };
    if !valid_object_name(name) || app.stateless() {
        return Err(Response::error(400, "not an object that takes messages"));
    }
    let Some(sender) = sender(req.query) else {
        return Err(Response::error(400, "from=<app>/<name>&id=<id>"));
    };
    if req.body.len() > OBJECT_MESSAGE_MAX_BYTES {
        return Err(Response::error(
            413,
            "a message is at most object_message_max_bytes",
        ));
    }
    Ok(Passed {
        app,
        name: name.to_string(),
        sender,
    })
}

#[cfg(test)]
mod tests {
    use super::{sender, ObjectKey};

    #[test]
    fn a_sender_is_an_app_a_name_and_a_positive_id() {
        assert_eq!(
            sender(Some("from=bank/alice&id=7")),
            ObjectKey::parse("bank/alice").map(|k| (k, 7))
        );
        for bad in [
            "from=bank/alice",
            "id=7",
            "from=bank&id=7",
            "from=bank/alice&id=0",
            "from=bank/alice&id=-1",
            "from=bank/.x&id=1",
            "from=/alice&id=1",
            "from=bank/alice&id=1&more=2",
            "from=ba nk/alice&id=1",
        ] {
            assert_eq!(sender(Some(bad)), None, "{bad}");
        }
        assert_eq!(sender(None), None);
    }
}
