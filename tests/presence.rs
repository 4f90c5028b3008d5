//! Presence as the node keeps it (README "Presence"), with real WebSocket clients: a numbered
//! session of an app that keeps presence is told its topic's members as it attaches and each
//! change after (one a batch), whoever joins or leaves, on any shard, after any idle pause; two
//! tabs of one user are one member; a plain session is listed but never told; the listing is
//! bounded per topic, on the node, and by each client's share.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::net::TcpStream;

use serde_json::Value;
use support::*;
use tungstenite::{Message, WebSocket};

const SECRET: &str = "combd-presence-test-secret-0123456789abcdef";

/// A numbered viewer of a room's topic, keeping the members it was told.
struct Viewer {
    ws: WebSocket<TcpStream>,
    /// Members by name, once the snapshot came.
    members: BTreeMap<String, Value>,
    unlisted: u64,
    snapshot: bool,
    /// The app's messages it got, payloads only.
    got: Vec<String>,
}

impl Viewer {
    fn on(ws: WebSocket<TcpStream>) -> Viewer {
        let mut v = Viewer {
            ws,
            members: BTreeMap::new(),
            unlisted: 0,
            snapshot: false,
            got: Vec::new(),
        };
        v.until(|v| v.snapshot);
        v
    }

    /// A numbered viewer of topic `t` of room `room`, from the default source address.
    fn open(node: &TestNode, room: &str, t: u32) -> Viewer {
        Viewer::on(open_ws(node, &path(room, t, true)))
    }

    /// Reads until `done` holds, applying presence as a client does: a change before the
    /// snapshot is dropped; the snapshot replaces; a change sets joins and removes leaves.
    fn until(&mut self, done: impl Fn(&Viewer) -> bool) {
        while !done(self) {
            let text = match self.ws.read().expect("timed out waiting for presence") {
                Message::Text(t) => t.as_str().to_string(),
                Message::Ping(_) | Message::Pong(_) => continue,
                other => panic!("unexpected {other:?}"),
            };
            let Some(json) = text.strip_prefix("!presence|") else {
                if let Some((head, payload)) = text.split_once('|') {
                    if !head.starts_with('!') {
                        self.got.push(payload.to_string());
                    }
                }
                continue;
            };
            let v: Value = serde_json::from_str(json).unwrap();
            self.apply(&v);
        }
    }

    fn apply(&mut self, v: &Value) {
        if let Some(members) = v["members"].as_array() {
            self.members = members
                .iter()
                .map(|m| (m["who"].as_str().unwrap().to_string(), m.clone()))
                .collect();
            self.snapshot = true;
        } else if self.snapshot {
            for m in v["join"].as_array().unwrap() {
                self.members
                    .insert(m["who"].as_str().unwrap().to_string(), m.clone());
            }
            for who in v["leave"].as_array().unwrap() {
                self.members.remove(who.as_str().unwrap());
            }
        }
        self.unlisted = v["unlisted"].as_u64().unwrap();
    }

    fn names(&self) -> Vec<String> {
        self.members.keys().cloned().collect()
    }

    fn close(mut self) {
        let _ = self.ws.close(None);
        while self.ws.read().is_ok() {}
    }
}

fn path(room: &str, t: u32, numbered: bool) -> String {
    let after = if numbered { "&combd_after=new" } else { "" };
    format!("/o/room/{room}?topic={t}{after}")
}

/// The member a viewer is, once it has its snapshot: the one listed that `others` do not name.
fn me(v: &Viewer, others: &[&str]) -> String {
    let mine: Vec<String> = v
        .names()
        .into_iter()
        .filter(|n| !others.contains(&n.as_str()))
        .collect();
    assert_eq!(mine.len(), 1, "{:?} less {others:?}", v.names());
    mine[0].clone()
}

#[test]
fn members_are_told_as_sessions_attach_and_leave() {
    let node = TestNode::start(&[TEST_APPS]);
    let mut a = Viewer::open(&node, "r1", 0);
    let a_id = me(&a, &[]);
    assert_eq!(a.members[&a_id]["devices"], 1);
    assert_eq!(a.members[&a_id]["verified"], false);

    // b joins: a is told, b's snapshot lists both.
    let b = Viewer::open(&node, "r1", 0);
    let b_id = me(&b, &[&a_id]);
    a.until(|a| a.members.contains_key(&b_id));
    assert_eq!(b.names().len(), 2);

    // A viewer of another topic of the room is not in this one, and sees only itself.
    let other = Viewer::open(&node, "r1", 1);
    assert_eq!(other.names().len(), 1);
    assert!(!other.members.contains_key(&a_id));

    // A plain session is listed, but is never told presence: the first it gets is the app's
    // broadcast.
    let mut plain = open_ws(&node, &path("r1", 0, false));
    a.until(|a| a.members.len() == 3);
    a.ws.send(Message::text("t0 hello")).unwrap();
    match plain.read().unwrap() {
        Message::Text(t) => assert_eq!(t.as_str(), "t0 hello"),
        other => panic!("unexpected {other:?}"),
    }
    let _ = plain.close(None);
    while plain.read().is_ok() {}
    b.close();
    a.until(|a| a.members.len() == 1);
    assert_eq!(a.names(), vec![a_id.clone()]);
    assert!(a.got.contains(&"t0 hello".to_string()), "{:?}", a.got);
    let s = node.stats();
    assert!(s["presence_changes"].as_u64().unwrap() >= 4, "{s}");
    other.close();
    a.close();
    wait_stats(&node, "every member gone", |s| s["fair_presence_held"] == 0);
}

#[test]
fn a_member_leaves_after_its_room_was_let_go() {
    // An object is let go a second after its last input while its sessions stay attached; a
    // detach that comes after must still find its member (no ghost).
    let node = TestNode::start(&[TEST_APPS]);
    let mut a = Viewer::open(&node, "idle", 0);
    let a_id = me(&a, &[]);
    let b = Viewer::open(&node, "idle", 0);
    let b_id = me(&b, &[&a_id]);
    a.until(|a| a.members.contains_key(&b_id));
    wait_stats(&node, "the room let go", |s| s["objects_live"] == 0);
    b.close();
    a.until(|a| !a.members.contains_key(&b_id));
    // And the last one out leaves too: a newcomer after another pause sees only itself.
    wait_stats(&node, "the room let go again", |s| s["objects_live"] == 0);
    a.close();
    wait_stats(&node, "a's member gone", |s| s["fair_presence_held"] == 0);
    let c = Viewer::open(&node, "idle", 0);
    assert_eq!(c.names().len(), 1, "{:?}", c.names());
    c.close();
}

/// A WebSocket to `path` carrying `sub`'s token as the subprotocol a browser offers.
fn open_as(node: &TestNode, path: &str, sub: &str) -> WebSocket<TcpStream> {
    let token = support::auth::token(SECRET, sub, Some(&sub.to_uppercase()));
    support::auth::open_ws_with(node, path, &token)
}

#[test]
fn two_tabs_of_one_user_are_one_member_with_two_devices() {
    let file = support::auth::key_file("presence", SECRET);
    let node = TestNode::start(&[
        TEST_APPS,
        ("COMBD_AUTH_JWT_KEY_FILE", file.to_str().unwrap()),
    ]);
    let mut watcher = Viewer::open(&node, "tabs", 0);
    let tab1 = Viewer::on(open_as(&node, &path("tabs", 0, true), "alice"));
    watcher.until(|w| w.members.contains_key("alice"));
    assert_eq!(watcher.members["alice"]["verified"], true);
    assert_eq!(watcher.members["alice"]["name"], "ALICE");
    assert_eq!(watcher.members["alice"]["devices"], 1);
    let tab2 = Viewer::on(open_as(&node, &path("tabs", 0, true), "alice"));
    watcher.until(|w| w.members["alice"]["devices"] == 2);
    assert_eq!(tab2.members["alice"]["devices"], 2);
    assert_eq!(watcher.names().len(), 2);
    tab1.close();
    watcher.until(|w| w.members["alice"]["devices"] == 1);
    tab2.close();
    watcher.until(|w| !w.members.contains_key("alice"));
    watcher.close();
}

#[test]
fn presence_is_bounded_per_topic_and_on_the_node() {
    let node = TestNode::start(&[
        TEST_APPS,
        ("COMBD_PRESENCE_TOPIC_MAX", "2"),
        ("COMBD_PRESENCE_MAX", "3"),
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "100"),
    ]);
    let s = node.stats();
    assert_eq!(s["limits"]["presence_topic_max"], 2, "{s}");
    assert_eq!(s["limits"]["presence_max"], 3, "{s}");
    let mut a = Viewer::open(&node, "full", 0);
    let a_id = me(&a, &[]);
    let b = Viewer::open(&node, "full", 0);
    let b_id = me(&b, &[&a_id]);
    a.until(|a| a.members.len() == 2);
    // The topic is full: c is attached, not listed, and counted.
    let c = Viewer::open(&node, "full", 0);
    assert_eq!((c.members.len(), c.unlisted), (2, 1));
    a.until(|a| a.unlisted == 1);
    // Another topic has room, the node one more member: d is listed, e is not.
    let d = Viewer::open(&node, "full", 1);
    let e = Viewer::open(&node, "full", 1);
    assert_eq!((e.members.len(), e.unlisted), (1, 1));
    let s = node.stats();
    assert_eq!(s["fair_presence_held"], 3, "{s}");
    assert_eq!(s["presence_unlisted"], 2, "{s}");
    // Alone on the node, the client's share is the whole pool: held, it is refused as over it.
    let refused = ["fair_presence_refused_full", "fair_presence_refused_share"]
        .map(|k| s[k].as_u64().unwrap());
    assert_eq!(refused.iter().sum::<u64>(), 1, "{refused:?}");
    // b leaves: room frees in its topic, and c, attached unlisted, is listed in its place (e
    // waits on: its topic lost no member).
    b.close();
    a.until(|a| !a.members.contains_key(&b_id) && a.members.len() == 2);
    assert_eq!(a.unlisted, 0);
    let c_id = me(&a, &[&a_id]);
    let mut e = e;
    let s = node.stats();
    assert_eq!(s["fair_presence_held"], 3, "{s}");
    // c leaves as a member; e, in the other topic, is still not listed.
    c.close();
    a.until(|a| !a.members.contains_key(&c_id));
    assert_eq!(a.names(), vec![a_id.clone()]);
    e.ws.send(Message::text("t1 ping")).unwrap();
    e.until(|e| e.got.iter().any(|g| g == "t1 ping"));
    assert_eq!((e.members.len(), e.unlisted), (1, 1));
    for v in [a, d, e] {
        v.close();
    }
    wait_stats(&node, "every member gone", |s| s["fair_presence_held"] == 0);
}

#[test]
fn one_client_lists_its_share_of_the_nodes_members() {
    // 20 members on the node, a client's share 10 % of it: one address lists two sessions,
    // and a third is unlisted while another address is still listed.
    let node = TestNode::start(&[TEST_APPS, ("COMBD_PRESENCE_MAX", "20")]);
    let from = |i: usize| {
        let stream = connect_from(client_address(i), node.public());
        let url = format!("ws://127.0.0.2:{}{}", node.port, path("share", 0, true));
        Viewer::on(tungstenite::client(url.as_str(), stream).unwrap().0)
    };
    let mut first = from(1);
    let second = from(1);
    let third = from(1);
    assert_eq!((third.members.len(), third.unlisted), (2, 1));
    let other = from(2);
    assert_eq!((other.members.len(), other.unlisted), (3, 1));
    first.until(|f| f.members.len() == 3);
    let s = node.stats();
    assert!(
        s["fair_presence_refused_share"].as_u64().unwrap() >= 1,
        "{s}"
    );
    for v in [first, second, third, other] {
        v.close();
    }
}

#[test]
fn a_presence_setting_of_zero_fails_start_up_naming_it() {
    for name in ["COMBD_PRESENCE_MAX", "COMBD_PRESENCE_TOPIC_MAX"] {
        let dir = std::env::temp_dir().join(format!("combd-presence-zero-{}", std::process::id()));
        let msg = refused(&mut combd_command(&dir, &[(name, "0")]));
        assert!(msg.contains(name), "{name}: {msg}");
    }
}

#[test]
fn members_on_either_shard_see_each_other_join_and_leave() {
    use combd_shards::app::home_shard;
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "2")]);
    let room = (0..)
        .map(|i| format!("x{i}"))
        .find(|r| home_shard("room", r, 2) == 1)
        .unwrap();
    // A member's name is its session, `<life>.<shard>.<id>`: open viewers until one holds its
    // connection on each shard (the others close).
    let mut on: [Option<(Viewer, String)>; 2] = [None, None];
    let mut known: Vec<String> = Vec::new();
    for _ in 0..200 {
        let v = Viewer::open(&node, &room, 0);
        let others: Vec<&str> = known.iter().map(String::as_str).collect();
        let id = me(&v, &others);
        known.push(id.clone());
        let shard: usize = id.split('.').nth(1).unwrap().parse().unwrap();
        match &on[shard] {
            None => on[shard] = Some((v, id)),
            Some(_) => v.close(),
        }
        if on.iter().all(Option::is_some) {
            break;
        }
    }
    let [Some((mut zero, zero_id)), Some((mut one, one_id))] = on else {
        panic!("no connection on one of the shards in 200");
    };
    zero.until(|v| v.members.len() == 2 && v.members.contains_key(&one_id));
    one.until(|v| v.members.len() == 2 && v.members.contains_key(&zero_id));
    zero.close();
    one.until(|v| v.members.len() == 1);
    assert_eq!(one.names(), vec![one_id]);
    one.close();
    wait_stats(&node, "every member gone", |s| s["fair_presence_held"] == 0);
}
