//! etcd's authentication (RBAC): the user a node calls as, and the token each member issues it.

use std::sync::Mutex;

use crate::http::Failure;

/// An etcd user (RBAC), its password, and the token the member that answered last issued it.
/// etcd's simple tokens live in the memory of the member that issued them, for its
/// `--auth-token-ttl` after their last use: a token is asked of the member a call goes to when
/// the one held is another member's, and again when that member answers 401 (it restarted, or
/// the token expired).
pub(super) struct EtcdUser {
    pub(super) name: String,
    pub(super) password: String,
    /// (the endpoint's index, its token).
    token: Mutex<Option<(usize, String)>>,
}

impl std::fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Neither the password nor a token: either lets its holder act as the node.
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl EtcdUser {
    /// The user `name` with `password`, holding no token yet.
    pub(super) fn new(name: &str, password: &str) -> EtcdUser {
        EtcdUser {
            name: name.to_string(),
            password: password.to_string(),
            token: Mutex::new(None),
        }
    }

    /// The token member `at` issued, if it is the one held.
    pub(super) fn token_for(&self, at: usize) -> Option<String> {
        let held = self.token.lock().unwrap_or_else(|p| p.into_inner());
        held.as_ref()
            .filter(|(e, _)| *e == at)
            .map(|(_, t)| t.clone())
    }

    /// Holds `token`, issued by member `at`, for the next calls.
    pub(super) fn hold(&self, at: usize, token: &str) {
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some((at, token.to_string()));
    }
}

/// The longest token accepted from etcd (a simple token is ~20 bytes, a JWT one ~300).
pub(super) const TOKEN_MAX_BYTES: usize = 4096;

/// Whether a failure of one member is worth trying the next for: it could not be reached, took
/// too long, or answered a server error (no leader, shutting down).
pub(super) fn another_member_may_answer(f: &Failure) -> bool {
    matches!(f, Failure::Unreachable(_) | Failure::Timeout)
        || matches!(f, Failure::Status { code, .. } if *code >= 500)
}
