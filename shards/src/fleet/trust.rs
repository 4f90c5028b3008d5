//! The fleet's trust zone on this node ([`Trust`]): what another node passes on is taken only
//! signed with the fleet key, and what this node passes on is signed (`combd_fleet::auth`).

use combd_fleet::auth::{self, AuthError, FleetKey, Replays};
use combd_kernel::fair::ClientKey;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::http::Response;

use super::FleetStats;

/// The fleet key, the signed requests taken lately, and this node's fleet address (what a
/// request to this node is signed for).
pub(crate) struct Trust {
    /// The fleet key: what this node passes on is signed with it, and what another node passes
    /// on is taken only signed with it.
    pub(super) key: Arc<FleetKey>,
    /// The signed requests taken lately (a replay is refused).
    replays: Replays,
    /// This node's fleet address.
    node: String,
    /// Counts the refusals.
    stats: Arc<FleetStats>,
}

impl Trust {
    /// Trusts what is signed with `key` for `node`; nothing signed before now is taken, so a
    /// request captured before a restart is not replayed after it.
    pub(super) fn new(key: Arc<FleetKey>, node: String, stats: Arc<FleetStats>) -> Trust {
        Trust {
            key,
            replays: Replays::since(auth::now_ms()),
            node,
            stats,
        }
    }

    /// Checks a request that came from the fleet (on the fleet listener, or marked forwarded)
    /// on a connection from `peer`: its [`auth::AUTH_HEADER`] (`signature`) must be the fleet
    /// key's over what arrived (with `client`, its [`combd_fleet::forward::CLIENT_HEADER`] or
    /// empty), to this node, lately, and not taken before, within the peer's share of the
    /// requests remembered. Refusals are counted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn authenticate(
        &self,
        peer: ClientKey,
        signature: Option<&[u8]>,
        method: &str,
        target: &str,
        client: &str,
        body: &[u8],
    ) -> Result<(), AuthError> {
        let now = auth::now_ms();
        let taken = self
            .key
            .verify(signature, &self.node, method, target, client, body, now)
            .and_then(|stamp| self.replays.admit(stamp, peer, now));
        match taken {
            Ok(()) => {}
            Err(AuthError::Busy) => {
                self.stats.auth_busy.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.stats.auth_refused.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("a request from the fleet was refused: {e}");
            }
        }
        taken
    }

    /// The [`auth::AUTH_HEADER`] value of a request to `owner` (a WebSocket's upgrade passed
    /// through) for the client at `client` (the [`combd_fleet::forward::CLIENT_HEADER`] it
    /// carries).
    pub(crate) fn sign(
        &self,
        owner: &str,
        method: &str,
        target: &str,
        client: &str,
        body: &[u8],
    ) -> String {
        self.key.sign_for(owner, method, target, client, body)
    }

    /// The [`combd_fleet::auth::ANSWER_HEADER`] value of this node's answer to the signed
    /// request whose signature was `request`.
    pub(crate) fn sign_answer(
        &self,
        request: &str,
        status: u16,
        fields: &str,
        body: &[u8],
    ) -> String {
        self.key.sign_answer(request, status, fields, body)
    }

    /// Signed requests remembered now (`fleet_auth_replays_held`).
    pub(super) fn replays_held(&self) -> usize {
        self.replays.held()
    }
}

/// The answer to a request from the fleet that `authenticate` refused: 401 (503 with
/// retry-after 1 when the node remembers too many to take one more).
pub fn auth_refused(e: AuthError) -> Response {
    match e {
        AuthError::Busy => Response::overloaded(),
        e => Response::error(401, &format!("fleet authentication failed: {e}"))
            .with_header("www-authenticate", "combd-fleet"),
    }
}
