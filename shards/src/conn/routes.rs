//! The route table: where a request goes. The node's own endpoints (`/healthz`, and on the
//! localhost listener `/stats`, `/metrics` and `/routes`, this table as JSON), the apps'
//! pages (with redirects to them: `/` to the first, a page's path without its trailing slash
//! to the page), and `/o/<app>/<name>`: a WebSocket upgrade, a stateless app called right
//! here, or a job for an object.

use std::sync::Arc;

use crate::app::{
    check_app_response, valid_object_name, App, AppError, CallBudget, Caller, Cx, Effect, Input,
    Output,
};
use crate::auth::{self, Client, Refused};
use crate::http::{Head, Request, Response};
use crate::object_key::ObjectKey;
use crate::stats::ShardStats;

use super::access::ConnLog;
use super::caller::{allow_origin, is_preflight, preflight, AllowOrigin};
use super::upgrade::{MuxUpgrade, Replay, Upgrade};
use crate::shared::ConnKind;
use crate::state::ShardState;
use crate::tls::Stream;
use crate::ws::numbered::{Resume, PARAM};

/// What routing knows of the connection a request came on: its shard, its listener, its
/// transport and peer, and its access-log figures (while the log is on).
pub(super) struct Router<'a> {
    pub state: &'a ShardState,
    /// On the localhost listener: the node's own endpoints are served.
    pub local: bool,
    pub listener: ConnKind,
    pub stream: &'a Stream,
    pub log: Option<&'a ConnLog>,
}

/// Where a request goes.
pub(super) enum Routed {
    Respond(Response),
    Upgrade(Upgrade),
    /// The multiplexed WebSocket (`GET /ws`).
    Mux(MuxUpgrade),
    /// The operator's look into objects (`/objects`, the localhost listener only).
    Inspect(crate::inspect::Ask),
    Object {
        app: Arc<dyn App>,
        object: String,
        client: Option<Arc<Client>>,
        caller: Arc<Caller>,
        /// The app's CORS policy lets the request's origin read the answer.
        cors: Option<AllowOrigin>,
        /// A message from another object, passed on by the fleet: its sender (`app/name`) and
        /// the sender's outbox id of it.
        message: Option<(ObjectKey, i64)>,
    },
}

/// The subprotocol the 101 answers (RFC 6455, 4.2.2): the first the client offered that the
/// app speaks, else `combd` if offered (a browser that offered its token as
/// `combd.bearer.<jwt>` offers `combd` beside it; never the token); else none, and a client
/// that insisted on one closes the connection itself.
fn subprotocol<'a>(
    speaks: &[&'static str],
    offered: impl Iterator<Item = &'a [u8]>,
) -> Option<&'static str> {
    let mut combd = false;
    for p in offered {
        if let Some(s) = speaks.iter().find(|s| s.as_bytes() == p) {
            return Some(s);
        }
        combd |= p == auth::PROTOCOL.as_bytes();
    }
    combd.then_some(auth::PROTOCOL)
}

/// The 401 of an identified app: no token, or one that failed (RFC 6750, 3).
fn unauthorized(why: &Refused) -> Response {
    let challenge = match why {
        Refused::Missing => "Bearer",
        Refused::Invalid(_) => "Bearer error=\"invalid_token\"",
        // Answered 503, not 401 (`identify`).
        Refused::Busy => "Bearer",
    };
    Response::error(401, "unauthorized").with_header("www-authenticate", challenge)
}

/// Where the node serves the JavaScript client, and the client.
pub const CLIENT_JS_PATH: &str = "/combd-client.js";
const CLIENT_JS: &str = include_str!("../../../clients/js/combd-client.js");

/// `/routes` (the localhost listener only): every route the node serves, read from its own
/// registry, so a client (the attack matrix, `tests/matrix.rs`) reaches each without a list of
/// its own. Its node routes (each with its methods and listener: `both` or `local`), its apps'
/// pages, and each app's `/o/<app>/{name}` with what the node knows of it: its kind, whether
/// it is stateless or identified, the largest input it takes and the subprotocols it speaks.
/// Every app route takes a WebSocket upgrade; which methods it answers is the app's to say (a
/// 405 names them in `allow`).
fn routes_json(apps: &crate::app::Apps) -> serde_json::Value {
    let mut routes = vec![
        node("/healthz", "both"),
        node(CLIENT_JS_PATH, "both"),
        node(crate::ws::mux::PATH, "both"),
    ];
    routes.extend(["/stats", "/metrics", "/routes"].map(|p| node(p, "local")));
    routes.push(serde_json::json!({
        "path": crate::inspect::PATH,
        "methods": ["GET", "HEAD", "POST", "DELETE"],
        "listener": "local",
        "under": true,
    }));
    let mut list = Vec::new();
    for app in apps.names().into_iter().filter_map(|n| apps.get(n)) {
        let page = app.page().map(|(path, _)| path);
        if let Some(path) = page {
            routes.push(serde_json::json!({
                "path": path, "methods": ["GET", "HEAD"], "listener": "both", "app": app.name(),
            }));
        }
        list.push(serde_json::json!({
            "name": app.name(),
            "path": format!("/o/{}/{{name}}", app.name()),
            "kind": if app.deployment().is_some() { "wasm" } else { "native" },
            "stateless": app.stateless(),
            "identified": app.identified(),
            "websocket": true,
            "max_input_bytes": app.max_input_bytes(),
            "subprotocols": app.subprotocols(),
            "page": page,
        }));
    }
    serde_json::json!({ "routes": routes, "apps": list })
}

/// One of the node's own routes in `/routes`: it answers `GET` and `HEAD`.
fn node(path: &str, listener: &str) -> serde_json::Value {
    serde_json::json!({ "path": path, "methods": ["GET", "HEAD"], "listener": listener })
}

/// The operator's request under `/objects` (`crate::inspect`), or why it is not one.
fn inspect(req: &Request<'_>, node: &crate::NodeShared) -> Routed {
    match crate::inspect::Ask::of(req, &node.apps) {
        Ok(ask) => Routed::Inspect(ask),
        Err(resp) => Routed::Respond(resp),
    }
}

/// Whether `path` is `root` or a path under it.
fn under(path: &str, root: &str) -> bool {
    path.strip_prefix(root)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn method_not_allowed() -> Response {
    Response::error(405, "method not allowed").with_header("allow", "GET, HEAD")
}

/// Where a path that is not a page redirects to, query kept: `/` to the first app's page
/// (302: the front page may change), and an app page's path without its trailing slash to
/// the page (308).
fn redirect(path: &str, pages: &[(&'static str, &'static str)]) -> Option<(u16, &'static str)> {
    if path == "/" {
        return pages.first().map(|(p, _)| (302, *p));
    }
    pages
        .iter()
        .find(|(p, _)| p.strip_suffix('/') == Some(path))
        .map(|(p, _)| (308, *p))
}

impl Router<'_> {
    /// Where `req` goes. `from_fleet`: another node of the fleet passed it on, signed.
    pub(super) fn route(&self, req: &Request<'_>, head: &Head, from_fleet: bool) -> Routed {
        let node = self.state.node();
        let get = matches!(req.method, "GET" | "HEAD");
        let resp = match req.path {
            "/healthz" if get => {
                Response::bytes(200, "application/json", br#"{"status":"ok"}"#.to_vec())
            }
            "/healthz" => method_not_allowed(),
            // The JavaScript client the apps' pages use (`clients/js/`), an ES module.
            CLIENT_JS_PATH if get => Response::bytes(
                200,
                "text/javascript; charset=utf-8",
                CLIENT_JS.as_bytes().to_vec(),
            )
            .with_header("cache-control", "no-cache"),
            CLIENT_JS_PATH => method_not_allowed(),
            "/stats" if self.local && get => {
                Response::bytes(200, "application/json", node.stats_json().into_bytes())
            }
            "/metrics" if self.local && get => Response::bytes(
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                node.metrics_text().into_bytes(),
            ),
            "/routes" if self.local && get => Response::json(200, &routes_json(&node.apps)),
            path if self.local && under(path, crate::inspect::PATH) => return inspect(req, node),
            crate::ws::mux::PATH if head.upgrade_websocket => {
                return self.route_mux(req, head, from_fleet)
            }
            crate::ws::mux::PATH => Response::error(
                426,
                "GET /ws is a WebSocket upgrade: many subscriptions on one socket",
            )
            .with_header("upgrade", "websocket"),
            "/stats" | "/metrics" | "/routes" if self.local => method_not_allowed(),
            path if from_fleet && path.starts_with(crate::fleet::MESSAGE_PATH) => {
                return passed_message(&node.apps, req, path)
            }
            path => match path
                .strip_prefix("/o/")
                .and_then(|rest| rest.split_once('/'))
            {
                None => {
                    let pages = node.apps.pages();
                    match (
                        pages.iter().find(|(p, _)| *p == path),
                        redirect(path, &pages),
                    ) {
                        (Some((_, page)), _) if get => {
                            Response::bytes(200, "text/html; charset=utf-8", page.as_bytes())
                        }
                        (Some(_), _) | (None, Some(_)) if !get => method_not_allowed(),
                        (None, Some((status, to))) => {
                            let to = match req.query {
                                Some(q) => format!("{to}?{q}"),
                                None => to.to_string(),
                            };
                            Response::json(status, &serde_json::json!({ "location": to }))
                                .with_header("location", to)
                        }
                        _ => Response::error(404, "not found"),
                    }
                }
                Some((app, object)) => {
                    return self.route_object(req, head, from_fleet, app, object)
                }
            },
        };
        Routed::Respond(resp)
    }

    /// `/o/<app>/<object>`, or `/o/<app>/<object>/<rest>` (the app is told `rest`).
    fn route_object(
        &self,
        req: &Request<'_>,
        head: &Head,
        from_fleet: bool,
        app: &str,
        object: &str,
    ) -> Routed {
        let Some(app) = self.state.node().apps.get(app) else {
            return Routed::Respond(Response::error(404, "no such app"));
        };
        let (object, rest) = match object_and_rest(object) {
            Ok(parts) => parts,
            Err(resp) => return Routed::Respond(resp),
        };
        // A preflight carries no credentials: answered by the app's CORS policy before its
        // identity check.
        if !head.upgrade_websocket && is_preflight(req) {
            return Routed::Respond(preflight(req, app.as_ref()));
        }
        let caller = super::caller::of(req, app.as_ref(), from_fleet, rest, self.stream);
        let client = match self.identify(req, app.as_ref(), self.address_key(&caller)) {
            Ok(client) => client,
            Err(resp) => return Routed::Respond(resp),
        };
        if head.upgrade_websocket {
            return self.route_upgrade(req, head, app, object, (client, caller));
        }
        if app
            .max_input_bytes()
            .is_some_and(|max| req.body.len() as u64 > max)
        {
            // Refused before it reaches a mailbox, as past COMBD_MAX_BODY.
            return Routed::Respond(Response::error(413, "request body too large"));
        }
        let cors = allow_origin(req, app.as_ref());
        if !app.stateless() {
            return Routed::Object {
                app: app.clone(),
                object: object.to_string(),
                client,
                caller,
                cors,
                message: None,
            };
        }
        let input = Input::Http {
            method: req.method,
            query: req.query,
            body: req.body,
            client: client.as_deref(),
            caller: &caller,
        };
        let mut resp = self.answer_stateless(app.as_ref(), &input);
        if let Some(cors) = &cors {
            cors.apply(&mut resp);
        }
        Routed::Respond(resp)
    }

    /// A WebSocket upgrade of `object` of `app`, for the client and caller the route found
    /// (`who`): the handshake's accept key, the compression and subprotocol negotiated and, in a
    /// fleet, the request kept to pass on.
    fn route_upgrade(
        &self,
        req: &Request<'_>,
        head: &Head,
        app: Arc<dyn App>,
        object: &str,
        who: (Option<Arc<Client>>, Arc<Caller>),
    ) -> Routed {
        let (client, caller) = who;
        // In a fleet, a stateful app's WebSocket may be passed through to its object's owner:
        // keep the request to send it on (not one another node already passed on).
        let replay = (!app.stateless()
            && self.state.node().fleet.is_some()
            && req.header(combd_fleet::forward::FORWARDED_HEADER).is_none())
        .then(|| Replay::of(req, caller.addr));
        let resume = match numbered_place(req, app.as_ref()) {
            Ok(resume) => resume,
            Err(resp) => return Routed::Respond(resp),
        };
        match websocket_accept(req, head) {
            Ok(accept) => {
                if let Some(log) = self.log {
                    log.keep_upgrade(req.method, req.path, head.len as u64);
                }
                let deflate = self
                    .state
                    .settings()
                    .ws_deflate
                    .then(|| {
                        crate::ws::deflate::offered(
                            req.headers
                                .iter()
                                .filter(|h| h.name.eq_ignore_ascii_case("sec-websocket-extensions"))
                                .map(|h| h.value),
                        )
                    })
                    .flatten();
                let protocol = subprotocol(
                    app.subprotocols(),
                    auth::offered_protocols(req.headers.iter().map(|h| (h.name, h.value))),
                );
                Routed::Upgrade(Upgrade {
                    app,
                    object: object.to_string(),
                    accept,
                    deflate,
                    protocol,
                    query: req.query.map(str::to_string),
                    replay,
                    client,
                    caller,
                    resume,
                    session: None,
                })
            }
            Err(resp) => Routed::Respond(resp),
        }
    }

    /// The multiplexed WebSocket's upgrade (`GET /ws`): its handshake's accept key, the
    /// subprotocol (`combd`, beside a token offered in one), and the client its token names:
    /// a token that fails is refused here (401), not taken for anyone's, since the client
    /// meant to be someone. No compression is negotiated.
    fn route_mux(&self, req: &Request<'_>, head: &Head, from_fleet: bool) -> Routed {
        let accept = match websocket_accept(req, head) {
            Ok(accept) => accept,
            Err(resp) => return Routed::Respond(resp),
        };
        let caller = super::caller::of_socket(req, from_fleet, self.stream);
        let asker = self.address_key(&caller);
        let node = self.state.node();
        let token = auth::token(req.headers.iter().map(|h| (h.name, h.value)));
        let client = match (&node.auth, token) {
            (_, None) => None,
            (None, Some(_)) => {
                return Routed::Respond(unauthorized(&Refused::Invalid(
                    "COMBD_AUTH_JWT_KEY_FILE is not set".into(),
                )))
            }
            (Some(a), Some(t)) => match a.verify_for(t, asker) {
                Ok(c) => {
                    ShardStats::add(&self.state.stats().auth_verified, 1);
                    Some(Arc::new(c))
                }
                Err(Refused::Busy) => return Routed::Respond(Response::overloaded()),
                Err(why) => {
                    ShardStats::add(&self.state.stats().auth_refused, 1);
                    return Routed::Respond(unauthorized(&why));
                }
            },
        };
        if let Some(log) = self.log {
            log.keep_upgrade(req.method, req.path, head.len as u64);
        }
        let offered = auth::offered_protocols(req.headers.iter().map(|h| (h.name, h.value)));
        Routed::Mux(MuxUpgrade {
            accept,
            protocol: subprotocol(&[], offered),
            client,
            caller,
        })
    }

    /// A stateless app's answer to `input`, called on the shard's loop; a failed call as the
    /// error response it makes (logged with its detail).
    fn answer_stateless(&self, app: &dyn App, input: &Input<'_>) -> Response {
        let (result, _) = call_stateless(self.state, app, input);
        match result.and_then(|out| match out {
            Output::Http(resp) => check_app_response(&resp).map(|()| resp),
            Output::None => Ok(Response::bytes(204, "application/json", Vec::new())),
        }) {
            Ok(resp) => resp,
            Err(e) => {
                if let Some(detail) = e.detail() {
                    tracing::warn!(app = app.name(), "{}: {detail}", e.message);
                }
                e.response()
            }
        }
    }

    /// The client the request's token names, if it has a valid one; for an identified app,
    /// the 401 when it has none. A public app's request with a bad token goes on as anyone's.
    /// `asker`: the client whose rate of full token checks a token the shard does not know
    /// takes from; past it, an identified app answers 503 `overloaded` (a public one goes on as
    /// anyone's).
    fn identify(
        &self,
        req: &Request<'_>,
        app: &dyn App,
        asker: combd_kernel::fair::ClientKey,
    ) -> Result<Option<Arc<Client>>, Response> {
        let node = self.state.node();
        // A page of another origin that only the app's CORS policy lets in, without the
        // user's cookies (`credentials: false`, a module's `*`): its request does not act with
        // the `combd_token` cookie the browser sent along.
        let cookies = self.origin_may_use_cookies(req, app);
        let token = auth::token(
            req.headers
                .iter()
                .filter(|h| cookies || !h.name.eq_ignore_ascii_case("cookie"))
                .map(|h| (h.name, h.value)),
        );
        let verified = match (&node.auth, token) {
            (_, None) => Err(Refused::Missing),
            (None, Some(_)) => Err(Refused::Invalid(
                "COMBD_AUTH_JWT_KEY_FILE is not set".into(),
            )),
            (Some(a), Some(t)) => a.verify_for(t, asker),
        }
        .and_then(|c| match c.for_app(app.name()) {
            true => Ok(c),
            false => Err(Refused::Invalid("the token is for other apps".into())),
        });
        match verified {
            Err(Refused::Busy) if app.identified() => Err(Response::overloaded()),
            Ok(client) => {
                ShardStats::add(&self.state.stats().auth_verified, 1);
                Ok(Some(Arc::new(client)))
            }
            Err(why) if app.identified() => {
                if let Refused::Invalid(reason) = &why {
                    tracing::debug!(app = app.name(), "token refused: {reason}");
                }
                ShardStats::add(&self.state.stats().auth_refused, 1);
                Err(unauthorized(&why))
            }
            Err(_) => Ok(None),
        }
    }

    /// Whether the request may act with the user's cookies: it has no `Origin`, or one the
    /// node's Origin policy takes, or one the app's CORS policy takes with credentials.
    fn origin_may_use_cookies(&self, req: &Request<'_>, app: &dyn App) -> bool {
        if req.header("origin").is_none()
            || self.state.settings().allowed_origins.allows(
                req.header("origin"),
                req.header("host"),
                matches!(self.stream, Stream::Tls(_)),
            )
        {
            return true;
        }
        super::caller::cors_of(req, app).is_some_and(|(_, c)| c.credentials)
    }

    /// Who asks by address, for the pools shared before its identity is known (`crate::fair`):
    /// the node's own machine on the localhost listener, else the client's address as the
    /// caller has it (for a request another node passed on, the address the client connected
    /// to it from).
    pub(super) fn address_key(&self, caller: &Caller) -> combd_kernel::fair::ClientKey {
        let local = self.listener == ConnKind::Local;
        combd_kernel::fair::ClientKey::of_peer(local, caller.addr)
    }
}

/// Calls a stateless app right here, on the shard's loop: no database, no mailbox, its
/// ticks limited as any call's. Returns its answer and the sends it made.
pub(super) fn call_stateless(
    state: &ShardState,
    app: &dyn App,
    input: &Input<'_>,
) -> (Result<Output, AppError>, Vec<Effect>) {
    let mut effects = Vec::new();
    let mut budget = CallBudget::new(state.settings().cpu_limit_ticks);
    let result = app.handle(&mut Cx::new(None, &mut effects, &mut budget), input);
    (result, effects)
}

/// A message between objects another node passed on (`path` under `MESSAGE_PATH`), to its
/// receiver's mailbox.
fn passed_message(apps: &crate::app::Apps, req: &Request<'_>, path: &str) -> Routed {
    match super::message::route(apps, req, path) {
        Ok(m) => Routed::Object {
            app: m.app,
            object: m.name,
            client: None,
            caller: Arc::new(Caller::default()),
            cors: None,
            message: Some(m.sender),
        },
        Err(resp) => Routed::Respond(resp),
    }
}

/// Checks a WebSocket upgrade request (RFC 6455, 4.2.1) and computes `Sec-WebSocket-Accept`.
/// The place a numbered session starts from (`combd_after` in the upgrade's query:
/// [`crate::ws::numbered`]), if it asks for one: a bad value, or an app that keeps no log (a
/// stateless one), is a 400 naming the parameter.
fn numbered_place(req: &Request<'_>, app: &dyn App) -> Result<Option<Resume>, Response> {
    let resume = Resume::from_query(req.query).map_err(|e| Response::error(400, &e))?;
    if resume.is_some() && app.stateless() {
        let e = format!("{PARAM}: app {} keeps no log (it is stateless)", app.name());
        return Err(Response::error(400, &e));
    }
    Ok(resume)
}

fn websocket_accept(req: &Request<'_>, head: &Head) -> Result<String, Response> {
    if req.method != "GET" {
        return Err(Response::error(405, "websocket upgrade needs GET").with_header("allow", "GET"));
    }
    if !head.http11 {
        return Err(Response::error(400, "websocket upgrade needs HTTP/1.1"));
    }
    if head.body_len != 0 {
        return Err(Response::error(400, "websocket upgrade with a body"));
    }
    let connection_upgrade = req.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("connection")
            && h.value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
    });
    if !connection_upgrade {
        return Err(Response::error(
            400,
            "websocket upgrade needs connection: upgrade",
        ));
    }
    let count = |name: &str| {
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .count()
    };
    if count("sec-websocket-version") > 1 || count("sec-websocket-key") > 1 {
        return Err(Response::error(
            400,
            "more than one sec-websocket-key or sec-websocket-version",
        ));
    }
    if req.header("sec-websocket-version").map(|v| v.trim_ascii()) != Some(b"13") {
        // RFC 9110, 15.5.22 and 7.8: a 426 names the protocol in `Upgrade`, and a server that
        // sends `Upgrade` sends `Connection: upgrade` with it.
        return Err(Response::error(426, "websocket version 13 required")
            .with_header("upgrade", "websocket")
            .with_header("connection", "upgrade")
            .with_header("sec-websocket-version", "13"));
    }
    match req.header("sec-websocket-key").map(|v| v.trim_ascii()) {
        Some(key) if valid_websocket_key(key) => Ok(tungstenite::handshake::derive_accept_key(key)),
        _ => Err(Response::error(400, "missing or invalid sec-websocket-key")),
    }
}

/// Whether a `Sec-WebSocket-Key` is the base64 of 16 bytes: 22 characters of the base64
/// alphabet, the last of which carries only 2 bits (`A`, `Q`, `g` or `w`), then `==`.
fn valid_websocket_key(key: &[u8]) -> bool {
    let b64 = |b: &u8| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/';
    key.len() == 24
        && key[..21].iter().all(b64)
        && b"AQgw".contains(&key[21])
        && &key[22..] == b"=="
}

/// An object's part of its route: its name and what follows it (`<object>/<rest>`, the app is
/// told `rest`), or the 400 for a name that is not one or a rest past
/// `app_path_rest_max_bytes`.
pub(super) fn object_and_rest(path: &str) -> Result<(&str, Option<&str>), Response> {
    let (object, rest) = match path.split_once('/') {
        Some((object, rest)) => (object, Some(rest)),
        None => (path, None),
    };
    if !valid_object_name(object) {
        return Err(Response::error(
            400,
            "invalid object name: 1 to 64 of A-Z a-z 0-9 _ . -, not starting with a dot",
        ));
    }
    if rest.is_some_and(|r| r.len() > combd_kernel::limits::APP_PATH_REST_MAX_BYTES) {
        return Err(Response::error(
            400,
            "the path under the object is longer than 1024 bytes (app_path_rest_max_bytes)",
        ));
    }
    Ok((object, rest))
}

#[cfg(test)]
mod tests {
    use super::{redirect, subprotocol, valid_websocket_key};

    #[test]
    fn redirects_go_to_app_pages() {
        let pages = [("/million/", "<html>"), ("/other/", "<html>")];
        assert_eq!(redirect("/", &pages), Some((302, "/million/")));
        assert_eq!(redirect("/million", &pages), Some((308, "/million/")));
        assert_eq!(redirect("/other", &pages), Some((308, "/other/")));
        assert_eq!(redirect("/millio", &pages), None);
        assert_eq!(redirect("/million//", &pages), None);
        assert_eq!(redirect("/", &[]), None);
    }

    #[test]
    fn the_subprotocol_is_the_first_offered_that_the_app_speaks() {
        let offered = |s: &'static str| s.split(',').map(|p| p.trim().as_bytes());
        let speaks = ["chat.v2", "chat.v1"];
        assert_eq!(
            subprotocol(&speaks, offered("x, chat.v1, chat.v2")),
            Some("chat.v1")
        );
        assert_eq!(
            subprotocol(&speaks, offered("combd, combd.bearer.t, chat.v2")),
            Some("chat.v2")
        );
        assert_eq!(
            subprotocol(&speaks, offered("combd, combd.bearer.t")),
            Some("combd")
        );
        assert_eq!(subprotocol(&speaks, offered("x")), None);
        assert_eq!(
            subprotocol(&[], offered("combd.bearer.t")),
            None,
            "never the token"
        );
        assert_eq!(subprotocol(&[], offered("")), None);
    }

    #[test]
    fn websocket_keys_are_base64_of_16_bytes() {
        assert!(valid_websocket_key(b"dGhlIHNhbXBsZSBub25jZQ=="));
        assert!(valid_websocket_key(b"AAAAAAAAAAAAAAAAAAAAAA=="));
        assert!(
            !valid_websocket_key(b"dGhlIHNhbXBsZSBub25jZR=="),
            "low bits set"
        );
        assert!(!valid_websocket_key(b"dGhlIHNhbXBsZSBub25jZQ="));
        assert!(!valid_websocket_key(b"dGhlIHNhbXBsZSBub25j!Q=="));
        assert!(!valid_websocket_key(b"xxxxxxxxxxxxxxxxxxxxxxxx"));
    }
}
