//! What the matrix attacks, read from the node's own registry (`GET /routes` on the localhost
//! listener), and how each route is asked: the methods an app answers are the app's to say, so
//! the harness learns them by asking once, from the node's own machine (held to no share).

use std::io::{BufReader, Write};

use crate::support::*;

/// Bodies tried, in order, for an app's `POST`: the first it answers 2xx with is its write.
/// A whole number (counters), a reminder (a JSON object with a delay and a text of 1,000
/// bytes), a byte (anything that takes any body). An app that takes none of them is attacked
/// with its reads only, and the table says so.
fn bodies() -> Vec<Vec<u8>> {
    let text = "x".repeat(1000);
    vec![
        b"1".to_vec(),
        format!("{{\"in_ms\":3600000,\"text\":\"{text}\"}}").into_bytes(),
        b"x".to_vec(),
    ]
}

/// Messages a WebSocket sends to keep a topic busy, in turn: a click, a chat line, a word.
pub fn messages(n: u64) -> Vec<String> {
    vec![
        format!("{{\"t\":\"click\",\"i\":{},\"c\":{n}}}", n % 4096),
        format!("{{\"t\":\"say\",\"text\":\"busy {n}\"}}"),
        format!("busy {n}"),
    ]
}

/// A route under attack: a node route (its path) or an app's `/o/<app>/{name}`.
#[derive(Clone)]
pub struct Target {
    /// As the table shows it: the path, `{name}` for an app's object.
    pub label: String,
    pub app: Option<AppRoute>,
}

/// An app's route, as the registry describes it and as the harness learned to ask it.
#[derive(Clone)]
pub struct AppRoute {
    pub name: String,
    pub identified: bool,
    pub stateless: bool,
    /// The largest input it takes: a request body, a WebSocket message.
    pub max_input: u64,
    /// The status of a `GET` of an object of its.
    pub get_status: u16,
    /// The first body of [`bodies`] it answered 2xx to a `POST` of, if any.
    pub write: Option<Vec<u8>>,
}

/// Who asks: an identified app is asked with a token of each role's own.
#[derive(Clone, Copy)]
pub enum Role {
    Setup,
    Attacker,
    Honest,
}

/// The key the node is started with (`COMBD_AUTH_JWT_KEY_FILE`), so identified apps are
/// attacked too, with tokens as any user of theirs gets one.
pub const SECRET: &str = "matrix-secret-of-at-least-32-bytes-0123456789";

pub fn token(role: Role) -> String {
    let sub = match role {
        Role::Setup => "setup",
        Role::Attacker => "attacker",
        Role::Honest => "honest",
    };
    auth::token(SECRET, sub, None)
}

/// A request of `method` for `path` with `body`, keep-alive, with `role`'s token if `app` is
/// identified.
pub fn http(method: &str, path: &str, body: &[u8], app: Option<&AppRoute>, role: Role) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n");
    if app.is_some_and(|a| a.identified) {
        head.push_str(&format!("Authorization: Bearer {}\r\n", token(role)));
    }
    if method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

impl Target {
    /// The path of the route for object `name` (a node route's own path).
    pub fn path(&self, name: &str) -> String {
        match &self.app {
            Some(a) => format!("/o/{}/{name}", a.name),
            None => self.label.clone(),
        }
    }

    /// The request a client makes of it for `name`: a `GET` where that is answered 2xx, else
    /// the app's write, else a `GET` all the same (its answer, a 405, is the app's).
    pub fn ask(&self, name: &str, role: Role) -> Vec<u8> {
        let path = self.path(name);
        match &self.app {
            Some(a) if !(200..300).contains(&a.get_status) && a.write.is_some() => {
                http("POST", &path, a.write.as_deref().unwrap(), Some(a), role)
            }
            app => http("GET", &path, b"", app.as_ref(), role),
        }
    }

    /// The request that writes to `name`, the first write of a new object: the app's write
    /// where it has one, else [`Target::ask`].
    pub fn write(&self, name: &str, role: Role) -> Vec<u8> {
        match &self.app {
            Some(a) if a.write.is_some() => http(
                "POST",
                &self.path(name),
                a.write.as_deref().unwrap(),
                Some(a),
                role,
            ),
            _ => self.ask(name, role),
        }
    }
}

/// One request on a connection of its own from the node's own machine.
fn local(node: &TestNode, raw: &[u8]) -> Resp {
    let mut s = connect(node.local());
    s.write_all(raw).unwrap();
    read_response(&mut BufReader::new(s))
}

/// Every route of `/routes` the public listener serves, each app's learned.
pub fn read(node: &TestNode) -> Vec<Target> {
    let r = local(node, b"GET /routes HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 200, "/routes: {}", r.text());
    let routes = r.json();
    let mut out: Vec<Target> = routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["listener"] == "both")
        .map(|r| Target {
            label: r["path"].as_str().unwrap().to_string(),
            app: None,
        })
        .collect();
    for a in routes["apps"].as_array().unwrap() {
        out.push(learn(node, a));
    }
    out
}

/// An app's route: what the registry says of it, and how it answers a `GET` and a `POST`.
fn learn(node: &TestNode, a: &serde_json::Value) -> Target {
    let max_body = node.stats()["limits"]["max_body_bytes"]
        .as_u64()
        .unwrap_or(1 << 20);
    let mut app = AppRoute {
        name: a["name"].as_str().unwrap().to_string(),
        identified: a["identified"].as_bool().unwrap(),
        stateless: a["stateless"].as_bool().unwrap(),
        max_input: a["max_input_bytes"].as_u64().unwrap_or(max_body),
        get_status: 0,
        write: None,
    };
    let path = format!("/o/{}/learn", app.name);
    app.get_status = local(node, &http("GET", &path, b"", Some(&app), Role::Setup)).status;
    app.write = bodies().into_iter().find(|b| {
        let r = local(node, &http("POST", &path, b, Some(&app), Role::Setup));
        (200..300).contains(&r.status)
    });
    Target {
        label: a["path"].as_str().unwrap().to_string(),
        app: Some(app),
    }
}
