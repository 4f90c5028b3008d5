//! Presence across a fleet (README "Presence", "The fleet"), on the chat app: an object's
//! sessions are all on its owner (a WebSocket asked of another node passes through to it), so
//! a viewer on any node sees the others join and leave as they do, and the sessions a killed
//! node carried leave as its connections to the owner drop, well within its lease.

use std::net::TcpStream;

use tungstenite::{Message, WebSocket};

use super::support::*;
use super::*;

const SECRET: &str = "combd-fleet-presence-secret-0123456789abcdef";

/// A numbered chat client of room `fp` on `node`, as user `sub`.
fn viewer(node: &TestNode, sub: &str) -> WebSocket<TcpStream> {
    let ws = auth::open_ws_with(
        node,
        "/o/chat/fp?combd_after=new",
        &auth::token(SECRET, sub, None),
    );
    ws.get_ref().set_read_timeout(Some(WAIT)).unwrap();
    ws
}

/// The next presence message of `ws` with field `field` (`members`, `join`, `leave`) not
/// empty, as JSON (a change before the members may come, and is passed over).
fn next_presence(ws: &mut WebSocket<TcpStream>, field: &str) -> serde_json::Value {
    loop {
        if let Message::Text(t) = ws.read().expect("timed out waiting for presence") {
            if let Some(json) = t.as_str().strip_prefix("!presence|") {
                let p: serde_json::Value = serde_json::from_str(json).unwrap();
                if p[field].as_array().is_some_and(|a| !a.is_empty()) {
                    return p;
                }
            }
        }
    }
}

#[test]
fn presence_spans_the_fleet_and_a_killed_nodes_sessions_leave_within_its_lease() {
    let Some(fleet) = Fleet::start("presence_spans_the_fleet") else {
        return;
    };
    let key = auth::key_file("fleet-presence", SECRET);
    let more = [("COMBD_AUTH_JWT_KEY_FILE", key.to_str().unwrap())];
    let a = fleet.node_on(LEASE_TTL, &fleet.s3.bucket.endpoint, &more);
    let b = fleet.node_on(LEASE_TTL, &fleet.s3.bucket.endpoint, &more);
    // The first to write owns the room: A.
    let mut x = viewer(&a, "xena");
    let members = next_presence(&mut x, "members");
    x.send(Message::text(r#"{"t":"say","text":"mine"}"#))
        .unwrap();
    while !matches!(x.read().unwrap(), Message::Text(t) if t.as_str().contains("mine")) {}
    assert!(stat(&a, "fleet_claims_won") >= 1);
    assert_eq!(members["members"].as_array().unwrap().len(), 1, "{members}");
    // A user on B is passed through to A, and joins the same room.
    let joined_at = Instant::now();
    let mut y = viewer(&b, "yuri");
    let seen_by_y = next_presence(&mut y, "members");
    assert_eq!(
        seen_by_y["members"].as_array().unwrap().len(),
        2,
        "{seen_by_y}"
    );
    // X is told Y joined (its own join, if it comes after its members, passed over).
    let x_who = members["members"][0]["who"].clone();
    let change = loop {
        let c = next_presence(&mut x, "join");
        if c["join"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["who"] != x_who)
        {
            break c;
        }
    };
    assert!(
        seen_by_y["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["who"] == change["join"][0]["who"]),
        "{change} {seen_by_y}"
    );
    assert!(
        joined_at.elapsed() < Duration::from_secs(1),
        "a join across nodes took {:?}",
        joined_at.elapsed()
    );
    assert!(stat(&b, "fleet_ws_passing") >= 1);
    // B dies with Y on it: Y leaves the room within B's lease.
    let killed_at = Instant::now();
    drop(b.kill9());
    let change = next_presence(&mut x, "leave");
    assert_eq!(change["leave"].as_array().unwrap().len(), 1, "{change}");
    let lease: Duration = Duration::from_secs(2);
    assert!(
        killed_at.elapsed() < lease,
        "the killed node's session left after {:?}",
        killed_at.elapsed()
    );
    drop(y);
}

/// The next text message of `ws` that `f` takes.
fn until_text(ws: &mut WebSocket<TcpStream>, f: impl Fn(&str) -> bool) -> String {
    // Bounded even while pings keep the socket from timing out.
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "timed out waiting for a message");
        if let Message::Text(t) = ws.read().expect("timed out waiting for a message") {
            if f(t.as_str()) {
                return t.as_str().to_string();
            }
        }
    }
}

/// A subscription on a multiplexed socket of one node to an object another node owns is
/// carried to the owner: its client is in the room's presence there, gets what is said there
/// numbered in the room's log, says things there, and leaves when it unsubscribes.
#[test]
fn a_subscription_to_another_nodes_object_is_carried_to_its_owner() {
    let Some(fleet) = Fleet::start("a_subscription_is_carried_to_the_owner") else {
        return;
    };
    let key = auth::key_file("fleet-mux", SECRET);
    let more = [("COMBD_AUTH_JWT_KEY_FILE", key.to_str().unwrap())];
    // The owner pings every 300 ms: the relay answers, or it would be closed.
    let pinged = [
        ("COMBD_AUTH_JWT_KEY_FILE", key.to_str().unwrap()),
        ("COMBD_WS_PING_INTERVAL", "300ms"),
    ];
    let a = fleet.node_on(LEASE_TTL, &fleet.s3.bucket.endpoint, &pinged);
    let b = fleet.node_on(LEASE_TTL, &fleet.s3.bucket.endpoint, &more);
    let mut x = viewer(&a, "xena");
    next_presence(&mut x, "members");
    x.send(Message::text(r#"{"t":"say","text":"mine"}"#))
        .unwrap();
    until_text(&mut x, |t| t.contains("mine"));
    // Yuri's socket on B subscribes to A's room.
    let mut y = auth::open_ws_with(&b, "/ws", &auth::token(SECRET, "yuri", None));
    y.get_ref().set_read_timeout(Some(WAIT)).unwrap();
    y.send(Message::text("+7|chat/fp?combd_after=new")).unwrap();
    let first = until_text(&mut y, |t| t.starts_with("+7|") || t.starts_with("-7|"));
    assert_eq!(first, "+7|", "the subscription was refused");
    let members = until_text(&mut y, |t| t.starts_with("7|!presence|{\"members\""));
    assert!(
        members.contains("xena") && members.contains("yuri"),
        "{members}"
    );
    assert_eq!(stat(&b, "fleet_ws_passing"), 1);
    next_presence(&mut x, "join");
    // What is said on A reaches Yuri, numbered in the room's log; what Yuri says reaches A.
    x.send(Message::text(r#"{"t":"say","text":"hello yuri"}"#))
        .unwrap();
    let said = until_text(&mut y, |t| t.contains("hello yuri"));
    let seq = said.strip_prefix("7|").unwrap().split('|').next().unwrap();
    assert!(seq.parse::<u64>().is_ok_and(|n| n >= 2), "{said}");
    y.send(Message::text(r#"7|{"t":"say","text":"from b"}"#))
        .unwrap();
    until_text(&mut x, |t| t.contains("from b"));
    // Past several of the owner's pings (time itself is what is tested; Xena reads, so her
    // client answers them), the relay was not closed for want of a pong.
    x.get_ref()
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let until = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < until {
        match x.read() {
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("xena's socket: {e}"),
        }
    }
    x.get_ref().set_read_timeout(Some(WAIT)).unwrap();
    y.send(Message::text(r#"7|{"t":"say","text":"still here"}"#))
        .unwrap();
    until_text(&mut x, |t| t.contains("still here"));
    assert_eq!(stat(&a, "ws_ping_timeouts"), 0);
    // Unsubscribed: Yuri leaves the room on A, and B carries nothing more.
    y.send(Message::text("-7|")).unwrap();
    until_text(&mut y, |t| t == "-7|");
    next_presence(&mut x, "leave");
    wait_stats(&b, "the relay ended", |s| s["fleet_ws_passing"] == 0);
    // Subscribed again, and the owner dies: the subscription ends (1013), the socket stays,
    // and its client subscribes again with its place once another node serves the room.
    y.send(Message::text("+8|chat/fp?combd_after=new")).unwrap();
    until_text(&mut y, |t| t == "+8|");
    drop(x);
    drop(a.kill9());
    let ended = until_text(&mut y, |t| t.starts_with("-8|"));
    assert!(ended.contains("\"code\":1013"), "{ended}");
    y.send(Message::text("1|x")).unwrap();
    let no_such = until_text(&mut y, |t| t.starts_with("-1|"));
    assert!(no_such.contains("404"), "the socket stays: {no_such}");
}
