//! Passing requests on to an object's owner ([`PassOn`]), and remembering owners that made a
//! request wait in vain (`unreachable`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use combd_fleet::auth::FleetKey;
use combd_fleet::Failure;

use crate::http::Response;

use super::unreachable::Unreachable;
use super::{Attempt, Failed, FleetStats};

/// What passing on to owners needs: the fleet key to sign with, the owners that could not be
/// reached a moment ago, and the counters.
pub struct PassOn {
    key: Arc<FleetKey>,
    /// Owners that could not be reached a moment ago.
    unreachable: Unreachable,
    stats: Arc<FleetStats>,
}

impl PassOn {
    /// Passes on signed with `key`, no owner unreachable yet.
    pub(super) fn new(key: Arc<FleetKey>, stats: Arc<FleetStats>) -> PassOn {
        PassOn {
            key,
            unreachable: Unreachable::default(),
            stats,
        }
    }

    /// Passes an HTTP request for object `key` (`app/name`) on to `owner` (its fleet address),
    /// over the shard's own sockets ([`super::client`]); the owner's answer (its body at most
    /// `fleet_forward_answer_max_bytes`), or 503 if the owner cannot be reached. What the
    /// app is told of it (`caller`: the client's address, its `Origin`, the path under the
    /// object, the header fields the app declared) goes with it.
    #[allow(clippy::too_many_arguments)]
    pub async fn forward(
        &self,
        owner: &str,
        key: &str,
        method: &str,
        query: Option<&str>,
        body: &[u8],
        token: Option<&str>,
        caller: &crate::app::Caller,
    ) -> Response {
        let rest = caller
            .rest
            .as_deref()
            .map_or(String::new(), |r| format!("/{r}"));
        let target = match query {
            Some(q) => format!("/o/{key}{rest}?{q}"),
            None => format!("/o/{key}{rest}"),
        };
        let Some(attempt) = self.may_try(owner) else {
            return owner_unreachable();
        };
        match super::client::forward(
            &self.key,
            owner,
            method,
            &target,
            body,
            token,
            caller,
            (
                attempt.connect_within(),
                combd_kernel::limits::FLEET_FORWARD_ANSWER_MAX_BYTES,
            ),
        )
        .await
        {
            Ok(f) if !crate::http::carries_body(f.status) => {
                // A peer is untrusted input: a status that cannot carry the body it came with
                // would desynchronise this connection's next response.
                self.owner_reached(owner);
                Response::error(502, "the owner answered an invalid status")
            }
            Ok(f) => {
                self.owner_reached(owner);
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                let mut resp = Response::bytes(f.status, content_type(f.content_type), f.body);
                for (name, value) in [("retry-after", f.retry_after), ("allow", f.allow)] {
                    if let Some(v) = value {
                        resp = resp.with_header(name, v);
                    }
                }
                // The app's own fields (a cookie, a redirect), checked again: a peer is
                // untrusted input.
                for (name, value) in f.headers {
                    if let Some(name) = crate::app::app_response_header(&name) {
                        if crate::app::valid_header_value(&value) {
                            resp = resp.with_header(name, value);
                        }
                    }
                }
                resp
            }
            Err(e) => {
                self.pass_failed(owner, attempt, &e);
                tracing::warn!(object = %key, %owner, "cannot pass the request on to the owner: {e}");
                owner_unreachable()
            }
        }
    }

    /// Passes message `id` of object `from`'s outbox (`app/name`) on to `owner`, the owner of
    /// its receiver `to` (`app/name`): `POST /_fleet/message/<to>?from=<from>&id=<id>`, signed
    /// (a path no node passes a client's request on to, so only a node's message is taken for
    /// one). The owner's answer: 200 once its receiver took it (durably), else why not; 503 if
    /// the owner cannot be reached (the sender sends it again later).
    pub async fn pass_message(
        &self,
        owner: &str,
        to: &str,
        from: &str,
        id: i64,
        body: &[u8],
    ) -> Response {
        let Some(attempt) = self.may_try(owner) else {
            return owner_unreachable();
        };
        let target = format!("{MESSAGE_PATH}{to}?from={from}&id={id}");
        let answer = super::client::forward(
            &self.key,
            owner,
            "POST",
            &target,
            body,
            None,
            &crate::app::Caller::default(),
            (
                attempt.connect_within(),
                combd_kernel::limits::FLEET_FORWARD_ANSWER_MAX_BYTES,
            ),
        )
        .await;
        match answer {
            Ok(f) => {
                self.owner_reached(owner);
                self.stats.messages_passed.fetch_add(1, Ordering::Relaxed);
                Response::bytes(f.status, "application/json", f.body)
            }
            Err(e) => {
                self.pass_failed(owner, attempt, &e);
                tracing::warn!(object = %to, %owner, "cannot pass a message on to the owner: {e}");
                owner_unreachable()
            }
        }
    }

    /// What a pass to `owner` that failed with `e` tells of it (counted in
    /// `fleet_forward_failed`).
    fn pass_failed(&self, owner: &str, attempt: Attempt, e: &Failure) {
        match e {
            Failure::Timeout => self.owner_failed(owner, attempt, Failed::Waited),
            Failure::Unreachable(_) => self.owner_failed(owner, attempt, Failed::AtOnce),
            // It answered, but not with what can be passed back (too long, not HTTP).
            _ => self.owner_reached(owner),
        }
        self.stats.forward_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether to try reaching `owner` now: not if it made a request wait in vain less than
    /// `FLEET_OWNER_RETRY_INTERVAL` ago, or another request is trying it again (counted in
    /// `fleet_owner_skipped`; the caller answers 503). An attempt is reported with
    /// [`PassOn::owner_reached`] or [`PassOn::owner_failed`].
    pub fn may_try(&self, owner: &str) -> Option<Attempt> {
        let attempt = self.unreachable.may_try(owner, Instant::now());
        if attempt.is_none() {
            self.stats.owner_skipped.fetch_add(1, Ordering::Relaxed);
        }
        attempt
    }

    /// `owner` answered.
    pub fn owner_reached(&self, owner: &str) {
        self.unreachable.reached(owner, Instant::now());
    }

    /// `attempt` of `owner` failed `how`.
    pub fn owner_failed(&self, owner: &str, attempt: Attempt, how: Failed) {
        self.unreachable.failed(owner, attempt, how, Instant::now());
    }
}

/// Where a node passes a message between objects on to the receiver's owner:
/// `<MESSAGE_PATH><app>/<name>?from=<app>/<name>&id=<id>`, taken only signed by the fleet.
pub const MESSAGE_PATH: &str = "/_fleet/message/";

/// The answer to a request whose object's owner cannot be reached.
pub fn owner_unreachable() -> Response {
    Response::error(503, "object owner unreachable").with_header("retry-after", "1")
}

/// A forwarded answer's content type, if it is one an app may answer with (else an octet
/// stream).
fn content_type(ct: Option<String>) -> String {
    ct.filter(|c| crate::app::valid_content_type(c))
        .unwrap_or_else(|| "application/octet-stream".to_string())
}
