//! etcd's JSON gateway over the fleet's members ([`Gateway`]): a call goes to the member that
//! answered last, then to the next ones while a member cannot answer, as the etcd user where
//! there is one (`user`: its token, asked of each member).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use combd_kernel::limits::{
    FLEET_AUTHENTICATE_TIMEOUT, FLEET_COORDINATOR_ANSWER_MAX_BYTES, FLEET_COORDINATOR_TIMEOUT,
};
use serde_json::{json, Value};

use super::user::{another_member_may_answer, EtcdUser, TOKEN_MAX_BYTES};
use super::{bad, CoordinatorError};
use crate::http::{self, Failure};
use crate::tls::FleetTls;

/// The members of the etcd cluster and how they are reached.
#[derive(Debug)]
pub(super) struct Gateway {
    endpoints: Vec<String>,
    /// The endpoint that answered last: calls start there.
    current: AtomicUsize,
    agent: ureq::Agent,
    /// The etcd user the calls are made as, where etcd has authentication on.
    user: Option<EtcdUser>,
}

impl Gateway {
    /// The members at `endpoints` (`http://host:port`, tried in turn).
    pub(super) fn new(endpoints: &[String]) -> Gateway {
        Gateway {
            endpoints: endpoints.to_vec(),
            current: AtomicUsize::new(0),
            agent: http::agent(FLEET_COORDINATOR_TIMEOUT, &FleetTls::default()),
            user: None,
        }
    }

    /// The members reached over `tls` at `https://` endpoints.
    pub(super) fn with_tls(mut self, tls: &FleetTls) -> Gateway {
        self.agent = http::agent(FLEET_COORDINATOR_TIMEOUT, tls);
        self
    }

    /// Posts `body` to `path` on the first endpoint that answers, starting from the one that
    /// answered last; the answer's JSON.
    pub(super) fn call(
        &self,
        op: &'static str,
        object: &str,
        path: &str,
        body: &Value,
    ) -> Result<Value, CoordinatorError> {
        let error = |failure| CoordinatorError {
            op,
            object: object.to_string(),
            failure,
        };
        let n = self.endpoints.len();
        let start = self.current.load(Ordering::Relaxed);
        let payload = body.to_string();
        let mut last = Failure::Unreachable("no endpoint".to_string());
        for i in 0..n {
            let at = (start + i) % n;
            let mut resp = match self.send_as_user(at, path, payload.as_bytes()) {
                Ok(r) => r,
                Err(f) if another_member_may_answer(&f) => {
                    last = f;
                    continue; // try the next member
                }
                Err(f) => return Err(error(f)),
            };
            if resp.status().is_server_error() {
                // A member without a leader, or shutting down: another may answer.
                last = http::status(&mut resp);
                continue;
            }
            self.current.store(at, Ordering::Relaxed);
            if !resp.status().is_success() {
                return Err(error(http::status(&mut resp)));
            }
            let bytes = http::body(&mut resp, FLEET_COORDINATOR_ANSWER_MAX_BYTES).map_err(error)?;
            return serde_json::from_slice(&bytes).map_err(|e| error(bad(format!("JSON: {e}"))));
        }
        Err(error(last))
    }

    /// The client, making every call as the etcd user `name` (RBAC): its token is asked for
    /// with `password` at the first call, and again whenever a member no longer takes it.
    pub(super) fn with_user(mut self, name: &str, password: &str) -> Gateway {
        self.user = Some(EtcdUser::new(name, password));
        self
    }

    /// Authenticates as the configured user now (at start-up, so a wrong password fails it
    /// naming the user's settings rather than at the first object); nothing without a user.
    pub(super) fn authenticate(&self) -> Result<(), CoordinatorError> {
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

    /// [`Gateway::send`] as the user, where there is one: with the token member `at`
    /// issued, asked for first if none is held for it, and asked for again once if the member
    /// answers 401 (the token expired or the member restarted).
    fn send_as_user(
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
