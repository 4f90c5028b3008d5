//! etcd's authentication (RBAC): the user a node calls as, and the token each member issues it.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use combd_kernel::limits::{
    FLEET_AUTHENTICATE_TIMEOUT, FLEET_COORDINATOR_ANSWER_MAX_BYTES, FLEET_COORDINATOR_TIMEOUT,
};
use serde_json::{json, Value};

use super::{bad, Coordinator, CoordinatorError};
use crate::http::{self, Failure};

/// An etcd user (RBAC), its password, and the token the member that answered last issued it.
/// etcd's simple tokens live in the memory of the member that issued them, for its
/// `--auth-token-ttl` after their last use: a token is asked of the member a call goes to when
/// the one held is another member's, and again when that member answers 401 (it restarted, or
/// the token expired).
pub(super) struct EtcdUser {
    name: String,
    password: String,
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
    fn token_for(&self, at: usize) -> Option<String> {
        let held = self.token.lock().unwrap_or_else(|p| p.into_inner());
        held.as_ref()
            .filter(|(e, _)| *e == at)
            .map(|(_, t)| t.clone())
    }

    fn hold(&self, at: usize, token: &str) {
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some((at, token.to_string()));
    }
}

/// The longest token accepted from etcd (a simple token is ~20 bytes, a JWT one ~300).
const TOKEN_MAX_BYTES: usize = 4096;

/// Whether a failure of one member is worth trying the next for: it could not be reached, took
/// too long, or answered a server error (no leader, shutting down).
pub(super) fn another_member_may_answer(f: &Failure) -> bool {
    matches!(f, Failure::Unreachable(_) | Failure::Timeout)
        || matches!(f, Failure::Status { code, .. } if *code >= 500)
}

impl Coordinator {
    /// The client, making every call as the etcd user `name` (RBAC): its token is asked for
    /// with `password` at the first call, and again whenever a member no longer takes it.
    pub fn with_user(mut self, name: &str, password: &str) -> Coordinator {
        self.user = Some(EtcdUser {
            name: name.to_string(),
            password: password.to_string(),
            token: Mutex::new(None),
        });
        self
    }

    /// Authenticates as the configured user now (at start-up, so a wrong password fails it
    /// naming the user's settings rather than at the first object); nothing without a user.
    pub fn authenticate(&self) -> Result<(), CoordinatorError> {
        if self.user.is_none() {
            return Ok(());
        }
        let n = self.endpoints.len();
        let start = self.current.load(Ordering::Relaxed);
        let mut last = Failure::Unreachable("no endpoint".to_string());
        for i in 0..n {
            let at = (start + i) % n;
            match self.token_from(at) {
                Ok(_) => {
                    self.current.store(at, Ordering::Relaxed);
                    return Ok(());
                }
                Err(f) => {
                    let next = another_member_may_answer(&f);
                    last = f;
                    if !next {
                        break; // a wrong password: the next member would say the same
                    }
                }
            }
        }
        Err(CoordinatorError {
            op: "authenticate",
            object: String::new(),
            failure: last,
        })
    }

    /// One POST to member `at`, with `token` as etcd's gateway takes it, over within
    /// `timeout`.
    fn send(
        &self,
        at: usize,
        path: &str,
        payload: &[u8],
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<ureq::http::Response<ureq::Body>, Failure> {
        let url = format!("{}{path}", self.endpoints[at]);
        let mut req = self
            .agent
            .post(&url)
            .config()
            .timeout_global(Some(timeout))
            .build()
            .header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", t);
        }
        req.send(payload).map_err(http::failure)
    }

    /// A new token for the user from member `at`, held for the next calls to it.
    fn token_from(&self, at: usize) -> Result<String, Failure> {
        let Some(user) = &self.user else {
            return Err(bad("no etcd user"));
        };
        let body = json!({ "name": user.name, "password": user.password }).to_string();
        let mut resp = self.send(
            at,
            "/v3/auth/authenticate",
            body.as_bytes(),
            None,
            FLEET_AUTHENTICATE_TIMEOUT,
        )?;
        if !resp.status().is_success() {
            return Err(http::status(&mut resp));
        }
        let bytes = http::body(&mut resp, FLEET_COORDINATOR_ANSWER_MAX_BYTES)?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| bad(format!("JSON: {e}")))?;
        let token = v["token"]
            .as_str()
            .filter(|t| {
                !t.is_empty()
                    && t.len() <= TOKEN_MAX_BYTES
                    && t.bytes().all(|b| b.is_ascii_graphic())
            })
            .ok_or_else(|| bad("authenticate: no token (is authentication on in etcd?)"))?
            .to_string();
        user.hold(at, &token);
        Ok(token)
    }

    /// [`Coordinator::send`] as the user, where there is one: with the token member `at`
    /// issued, asked for first if none is held for it, and asked for again once if the member
    /// answers 401 (the token expired or the member restarted).
    pub(super) fn send_as_user(
        &self,
        at: usize,
        path: &str,
        payload: &[u8],
    ) -> Result<ureq::http::Response<ureq::Body>, Failure> {
        let Some(user) = &self.user else {
            return self.send(at, path, payload, None, FLEET_COORDINATOR_TIMEOUT);
        };
        let token = match user.token_for(at) {
            Some(t) => t,
            None => self.token_from(at)?,
        };
        let resp = self.send(at, path, payload, Some(&token), FLEET_COORDINATOR_TIMEOUT)?;
        if resp.status().as_u16() != 401 {
            return Ok(resp);
        }
        let token = self.token_from(at)?;
        self.send(at, path, payload, Some(&token), FLEET_COORDINATOR_TIMEOUT)
    }
}
