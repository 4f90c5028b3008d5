//! A message between objects that another node of the fleet passes on to this one, the
//! receiver's owner (`crate::fleet` `pass_message`): `POST /_fleet/message/<app>/<name>
//! ?from=<app>/<name>&id=<id>`, routed only when signed by the fleet (the fleet key's MAC covers
//! the target and the body; no node passes a client's request on to this path, so a client
//! cannot make one). It goes to the receiver's mailbox as the sender's message, taken exactly
//! once like one from this node.

use std::sync::Arc;

use combd_kernel::limits::OBJECT_MESSAGE_MAX_BYTES;

use crate::app::{valid_object_name, Caller};
use crate::fleet::MESSAGE_PATH;
use crate::http::{Request, Response};

use super::routes::Routed;
use crate::app::Apps;

/// The sender (`app/name`) and its outbox id of a message's `?from=<app>/<name>&id=<id>`.
fn sender(query: Option<&str>) -> Option<(String, i64)> {
    let (mut from, mut id) = (None, None);
    for pair in query?.split('&') {
        match pair.split_once('=') {
            Some(("from", v)) => from = Some(v),
            Some(("id", v)) => id = v.parse::<i64>().ok().filter(|id| *id > 0),
            _ => return None,
        }
    }
    let from = from?;
    let (app, name) = from.split_once('/')?;
    let app_ok = !app.is_empty()
        && app.len() <= 64
        && app
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    (app_ok && valid_object_name(name)).then_some((from.to_string(), id?))
}

/// Where a message passed on by the fleet goes (`path` under [`MESSAGE_PATH`]), among `apps`.
pub(super) fn route(apps: &Apps, req: &Request<'_>, path: &str) -> Routed {
    if req.method != "POST" {
        return Routed::Respond(
            Response::error(405, "method not allowed").with_header("allow", "POST"),
        );
    }
    let Some((app, name)) = path[MESSAGE_PATH.len()..].split_once('/') else {
        return Routed::Respond(Response::error(404, "not found"));
    };
    let Some(app) = apps.get(app) else {
        return Routed::Respond(Response::error(404, "no such app"));
    };
    if !valid_object_name(name) || app.stateless() {
        return Routed::Respond(Response::error(400, "not an object that takes messages"));
    }
    let Some(message) = sender(req.query) else {
        return Routed::Respond(Response::error(400, "from=<app>/<name>&id=<id>"));
    };
    if req.body.len() > OBJECT_MESSAGE_MAX_BYTES {
        return Routed::Respond(Response::error(
            413,
            "a message is at most object_message_max_bytes",
        ));
    }
    Routed::Object {
        app,
        object: name.to_string(),
        client: None,
        caller: Arc::new(Caller::default()),
        cors: None,
        message: Some(message),
    }
}

#[cfg(test)]
mod tests {
    use super::sender;

    #[test]
    fn a_sender_is_an_app_a_name_and_a_positive_id() {
        assert_eq!(
            sender(Some("from=bank/alice&id=7")),
            Some(("bank/alice".to_string(), 7))
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
