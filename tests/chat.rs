//! The chat app against the real node with real WebSocket clients (tungstenite), each with a
//! token offered as the subprotocol a browser would use, and each numbered as the page is
//! (`combd_after`): two users see each other's messages and presence (the node's); a client
//! cut off resumes from its place in the room's log and ends with every message exactly once;
//! one whose place is gone gets the hello and is told so; a kill -9 leaves no ghost in the
//! room; no token, no room.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::path::PathBuf;

use serde_json::Value;
use support::*;
use tungstenite::WebSocket;

const SECRET: &str = "combd-chat-test-secret-0123456789abcdef-xyz";

fn key_file() -> PathBuf {
    support::auth::key_file("chat", SECRET)
}

fn settings(file: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![(
        "COMBD_AUTH_JWT_KEY_FILE",
        file.to_str().unwrap().to_string(),
    )]
}

fn start(file: &std::path::Path) -> TestNode {
    let s = settings(file);
    let env: Vec<(&str, &str)> = s.iter().map(|(k, v)| (*k, v.as_str())).collect();
    TestNode::start(&env)
}

fn token(sub: &str, name: &str) -> String {
    support::auth::token(SECRET, sub, Some(name))
}

/// A user in a room as the page is: numbered, keeping its place, the members it was told, and
/// the messages it took (by id, once each).
struct Chatter {
    ws: WebSocket<TcpStream>,
    place: Option<(u64, u64)>,
    /// A position came on this connection: numbers count from it.
    placed: bool,
    /// Why the last position was sent (`new`, `resumed`, `snapshot`).
    why: String,
    hello: Option<Value>,
    members: BTreeSet<String>,
    present: bool,
    /// Message ids taken, in order.
    ids: Vec<u64>,
    errors: Vec<String>,
}

impl Chatter {
    /// `sub` joins `room`: new, or from `place`. Returns once it is live (the hello came, or
    /// its place resumed) and knows who is in the room.
    fn join(node: &TestNode, room: &str, sub: &str, place: Option<(u64, u64)>) -> Chatter {
        let mut c = Chatter {
            ws: Chatter::open(node, room, sub, place),
            place,
            placed: false,
            why: String::new(),
            hello: None,
            members: BTreeSet::new(),
            present: false,
            ids: Vec::new(),
            errors: Vec::new(),
        };
        c.until(|c| c.present && (c.hello.is_some() || c.why == "resumed"));
        c
    }

    fn open(
        node: &TestNode,
        room: &str,
        sub: &str,
        place: Option<(u64, u64)>,
    ) -> WebSocket<TcpStream> {
        use tungstenite::client::IntoClientRequest;
        let after = place.map_or("new".to_string(), |(e, s)| format!("{e}.{s}"));
        let mut req = format!(
            "ws://127.0.0.2:{}/o/chat/{room}?combd_after={after}",
            node.port
        )
        .into_client_request()
        .unwrap();
        let name = format!("{}{}", sub[..1].to_uppercase(), &sub[1..]);
        req.headers_mut().insert(
            "sec-websocket-protocol",
            format!("combd, combd.bearer.{}", token(sub, &name))
                .parse()
                .unwrap(),
        );
        let (ws, resp) = tungstenite::client(req, connect(node.public())).unwrap();
        assert_eq!(resp.headers()["sec-websocket-protocol"], "combd");
        ws
    }

    /// Reads until `done` holds, as the protocol asks a client to.
    fn until(&mut self, done: impl Fn(&Chatter) -> bool) {
        while !done(self) {
            let text = match self.ws.read().expect("timed out waiting") {
                tungstenite::Message::Text(t) => t.as_str().to_string(),
                tungstenite::Message::Ping(_) | tungstenite::Message::Pong(_) => continue,
                other => panic!("unexpected {other:?}"),
            };
            let (head, payload) = text.split_once('|').unwrap();
            self.take(head, payload);
        }
    }

    fn take(&mut self, head: &str, payload: &str) {
        if head == "!presence" {
            let p: Value = serde_json::from_str(payload).unwrap();
            let who = |v: &Value| {
                v.as_str()
                    .map_or(v["who"].as_str(), Some)
                    .unwrap()
                    .to_string()
            };
            if let Some(members) = p["members"].as_array() {
                self.members = members.iter().map(who).collect();
                self.present = true;
            } else if self.present {
                p["join"].as_array().unwrap().iter().for_each(|m| {
                    self.members.insert(who(m));
                });
                p["leave"].as_array().unwrap().iter().for_each(|m| {
                    self.members.remove(&who(m));
                });
            }
        } else if let Some(place) = head.strip_prefix('!') {
            let (e, l) = place.split_once('.').unwrap();
            let (epoch, last) = (e.parse().unwrap(), l.parse().unwrap());
            // A resume's frames follow its position: the client counts from its own place.
            self.place = match (payload, self.place) {
                ("resumed", Some((_, mine))) => Some((epoch, mine)),
                _ => Some((epoch, last)),
            };
            self.placed = true;
            self.why = payload.to_string();
        } else if head.is_empty() {
            // The session's own: its hello, or an error.
            let m: Value = serde_json::from_str(payload).unwrap();
            if m["t"] == "hello" {
                self.ids.extend(ids(&m["history"]));
                self.hello = Some(m);
            } else {
                self.errors.push(m["error"].as_str().unwrap().to_string());
            }
        } else {
            let seq: u64 = head.parse().unwrap();
            let (epoch, last) = self.place.unwrap();
            if !self.placed || seq <= last {
                return;
            }
            assert_eq!(seq, last + 1, "a gap in the log's numbers");
            self.place = Some((epoch, seq));
            let m: Value = serde_json::from_str(payload).unwrap();
            self.ids.push(m["id"].as_u64().unwrap());
        }
    }

    fn say(&mut self, text: &str) {
        let m = serde_json::json!({ "t": "say", "text": text }).to_string();
        self.ws.send(tungstenite::Message::text(m)).unwrap();
    }

    /// Says `text` and waits for it to come back.
    fn said(&mut self, text: &str) -> u64 {
        let before = self.ids.len();
        self.say(text);
        self.until(|c| c.ids.len() > before);
        *self.ids.last().unwrap()
    }

    fn error(&mut self) -> String {
        let before = self.errors.len();
        self.until(|c| c.errors.len() > before);
        self.errors.last().unwrap().clone()
    }

    fn members(&self) -> Vec<&str> {
        self.members.iter().map(String::as_str).collect()
    }
}

fn ids(history: &Value) -> Vec<u64> {
    history
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn two_users_see_each_others_messages_and_presence() {
    let file = key_file();
    let node = start(&file);
    let mut alice = Chatter::join(&node, "r1", "alice", None);
    let hello = alice.hello.clone().unwrap();
    assert_eq!(
        (&hello["me"], &hello["history"]),
        (&"alice".into(), &serde_json::json!([]))
    );
    assert_eq!(hello["last"], 0);
    assert_eq!(alice.members(), ["alice"]);
    let mut bob = Chatter::join(&node, "r1", "bob", None);
    assert_eq!(bob.members(), ["alice", "bob"]);
    alice.until(|a| a.members.contains("bob"));

    assert_eq!(alice.said("hi bob"), 1);
    bob.until(|b| b.ids == [1]);
    assert_eq!(bob.said("hi alice"), 2);
    alice.until(|a| a.ids == [1, 2]);
    // A second tab of bob's: he is in the room once, and its close does not make him leave.
    let bob2 = Chatter::join(&node, "r1", "bob", None);
    drop(bob2);
    bob.ws.close(None).unwrap();
    alice.until(|a| !a.members.contains("bob"));
    let got = request(
        node.public(),
        b"GET /o/chat/r1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(got.status, 401, "a room is for identified clients only");
    let got = request(
        node.public(),
        format!(
            "GET /o/chat/r1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            token("carol", "Carol")
        )
        .as_bytes(),
    );
    assert_eq!(
        got.json(),
        serde_json::json!({ "last": 2, "presence": ["alice"] })
    );

    // Bad input: an error to the sender, nothing stored.
    alice.say(&"x".repeat(4097));
    assert!(alice.error().contains("4096"));
    alice.say("");
    alice.error();
    assert_eq!(
        alice.said("still here"),
        3,
        "ids go up by one per stored message"
    );
}

#[test]
fn a_client_cut_off_resumes_from_its_place_and_sees_every_message_once() {
    let file = key_file();
    let node = start(&file);
    let mut alice = Chatter::join(&node, "r2", "alice", None);
    let mut bob = Chatter::join(&node, "r2", "bob", None);
    for i in 0..3 {
        alice.said(&format!("before {i}"));
    }
    bob.until(|b| b.ids.len() == 3);
    let place = bob.place;
    drop(bob); // cut, without a close
    for i in 0..5 {
        alice.said(&format!("while away {i}"));
    }
    // Every message up to 8 is committed (alice saw each come back): the log replays 4 to 8,
    // and there is no hello.
    let mut back = Chatter::join(&node, "r2", "bob", place);
    assert_eq!(back.why, "resumed");
    assert!(back.hello.is_none());
    back.until(|b| b.ids.len() == 5);
    alice.said("welcome back");
    back.until(|b| b.ids.len() == 6);
    assert_eq!(
        back.ids,
        (4..=9).collect::<Vec<_>>(),
        "every message once, in order"
    );
    // A fresh join gets the last 50 and what the room's last id is.
    let carol = Chatter::join(&node, "r2", "carol", None);
    let hello = carol.hello.unwrap();
    assert_eq!(ids(&hello["history"]), (1..=9).collect::<Vec<_>>());
    assert_eq!(hello["last"], 9);
}

#[test]
fn a_client_whose_place_is_gone_gets_the_hello_and_is_told_so() {
    let file = key_file();
    let node = start(&file);
    let mut alice = Chatter::join(&node, "r3", "alice", None);
    alice.said("first");
    let place = alice.place;
    // 300 messages of 4,096 bytes: the room's log keeps 1 MiB, so the first is trimmed.
    let text = "x".repeat(4096);
    for _ in 0..3 {
        let before = alice.ids.len();
        for _ in 0..100 {
            alice.say(&text);
        }
        alice.until(|a| a.ids.len() == before + 100);
    }
    let bob = Chatter::join(&node, "r3", "bob", place);
    assert_eq!(bob.why, "snapshot");
    assert_eq!(
        ids(&bob.hello.unwrap()["history"]),
        (252..=301).collect::<Vec<_>>()
    );
}

#[test]
fn a_room_keeps_its_last_ten_thousand_messages() {
    use combd_kernel::limits::CHAT_RETAIN_MESSAGES as RETAIN;
    let file = key_file();
    let node = start(&file);
    // Six users, one after another, each within its connection's message burst
    // (COMBD_WS_BURST, 2,000), in bursts that fit the room's mailbox.
    let total = RETAIN + 5;
    let share = total.div_ceil(6);
    let mut sent = 0;
    for u in 0..6 {
        let mut user = Chatter::join(&node, "kept", &format!("u{u}"), None);
        let until = (sent + share).min(total);
        while sent < until {
            let burst = (until - sent).min(200);
            for i in 0..burst {
                user.say(&format!("m{}", sent + i));
            }
            sent += burst;
            user.until(|u| u.ids.last() == Some(&(sent as u64)));
        }
    }
    // The room's database holds exactly the last RETAIN, ids 6 to RETAIN + 5.
    let db = rusqlite::Connection::open_with_flags(
        node.data_dir.join("objects/chat/kept.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let (n, first, last): (usize, u64, u64) = db
        .query_row("SELECT count(*), min(id), max(id) FROM messages", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!((n, first, last), (RETAIN, 6, (RETAIN + 5) as u64));
    let bob = Chatter::join(&node, "kept", "bob", None);
    let last = (RETAIN + 5) as u64;
    assert_eq!(
        ids(&bob.hello.unwrap()["history"]),
        (last - 49..=last).collect::<Vec<_>>()
    );
}

#[test]
fn a_node_killed_with_users_in_a_room_leaves_no_ghost_in_it() {
    let file = key_file();
    let node = start(&file);
    let mut bob = Chatter::join(&node, "r4", "bob", None);
    bob.said("last words");
    let data = node.kill9();
    let s = settings(&file);
    let env: Vec<(&str, &str)> = s.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let node = TestNode::start_in(data, &env);
    let alice = Chatter::join(&node, "r4", "alice", None);
    assert_eq!(
        alice.members(),
        ["alice"],
        "bob's session died with the node"
    );
    assert_eq!(alice.hello.unwrap()["history"][0]["text"], "last words");
}

#[test]
fn a_client_that_asks_for_the_chat_protocol_gets_it() {
    use tungstenite::client::IntoClientRequest;
    let file = key_file();
    let node = start(&file);
    let offer = |protocols: &str| {
        let mut req = format!("ws://127.0.0.2:{}/o/chat/proto", node.port)
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            "sec-websocket-protocol",
            format!("{protocols}, combd.bearer.{}", token("alice", "Alice"))
                .parse()
                .unwrap(),
        );
        let (_, resp) = tungstenite::client(req, connect(node.public())).unwrap();
        resp.headers()["sec-websocket-protocol"]
            .to_str()
            .unwrap()
            .to_string()
    };
    // The app's own protocol wins where the client offers it, first or not; else `combd`.
    assert_eq!(offer("combd.chat.v1, combd"), "combd.chat.v1");
    assert_eq!(offer("combd, combd.chat.v1"), "combd.chat.v1");
    assert_eq!(offer("combd"), "combd");
}

#[test]
fn a_user_who_leaves_after_the_room_was_let_go_leaves_presence() {
    let file = key_file();
    let node = start(&file);
    let mut alice = Chatter::join(&node, "r7", "alice", None);
    let mut bob = Chatter::join(&node, "r7", "bob", None);
    alice.until(|a| a.members.contains("bob"));
    // Both idle: the room object is let go while their sessions stay attached.
    wait_stats(&node, "the idle room to be let go", |s| {
        s["objects_live"] == 0
    });
    // Bob closes his tab: the room is opened again for his detach, and alice sees him leave.
    bob.ws.close(None).unwrap();
    alice.until(|a| !a.members.contains("bob"));
    // The last one out, after another idle pause, leaves an empty room.
    wait_stats(&node, "the idle room to be let go again", |s| {
        s["objects_live"] == 0
    });
    let restores = node.stats()["restores"].as_u64().unwrap();
    alice.ws.close(None).unwrap();
    // Her detach opens the room once more, runs, and the room is let go after it.
    wait_stats(&node, "alice's detach to have run", |s| {
        s["restores"].as_u64() > Some(restores) && s["objects_live"] == 0
    });
    let carol = Chatter::join(&node, "r7", "carol", None);
    assert_eq!(
        carol.members(),
        ["carol"],
        "nobody who left is still listed"
    );
}

/// `GET /o/chat/<room>?user=<sub>` with any user's token.
fn where_is(node: &TestNode, sub: &str) -> Resp {
    request(
        node.public(),
        format!(
            "GET /o/chat/any?user={sub} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            token("carol", "Carol")
        )
        .as_bytes(),
    )
}

#[test]
fn a_user_is_seen_across_rooms_on_its_devices_and_last_seen_once_gone() {
    let file = key_file();
    let node = start(&file);
    assert_eq!(where_is(&node, "alice").status, 404, "never seen");
    // Bob watches both rooms.
    let mut bob_lobby = Chatter::join(&node, "lobby", "bob", None);
    let mut bob_games = Chatter::join(&node, "games", "bob", None);
    let a1 = Chatter::join(&node, "lobby", "alice", None);
    let a2 = Chatter::join(&node, "games", "alice", None);
    let a3 = Chatter::join(&node, "games", "alice", None);
    bob_lobby.until(|b| b.members.contains("alice"));
    bob_games.until(|b| b.members.contains("alice"));
    let seen = where_is(&node, "alice").json();
    let rooms: Vec<(String, u64)> = seen["rooms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["room"].as_str().unwrap().to_string(),
                r["devices"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rooms, [("games".to_string(), 2), ("lobby".to_string(), 1)]);
    assert_eq!(seen["last_seen"], Value::Null, "here now");
    for c in [a1, a2, a3] {
        drop(c);
    }
    // Once bob saw her leave both rooms, she is nowhere, last seen then.
    bob_lobby.until(|b| b.present && !b.members.contains("alice"));
    bob_games.until(|b| b.present && !b.members.contains("alice"));
    let gone = where_is(&node, "alice").json();
    assert_eq!(gone["rooms"], serde_json::json!([]), "{gone}");
    assert!(
        gone["last_seen"].as_u64().unwrap() > 1_700_000_000_000,
        "{gone}"
    );
    assert_eq!(where_is(&node, "%zz").status, 400);
}
