//! The chat app against the real node with real WebSocket clients (tungstenite), each with a
//! token offered as the subprotocol a browser would use: two users see each other's messages
//! and presence; a client cut off resumes with `?after=` and ends with every message exactly
//! once; past 1,000 missed messages the hello says `gap`; a kill -9 leaves no ghost in the
//! room; no token, no room.

#![allow(clippy::unwrap_used)]

mod support;

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

/// `sub` in `room`, resuming after message `after` if given; its hello.
fn join(
    node: &TestNode,
    room: &str,
    sub: &str,
    after: Option<u64>,
) -> (WebSocket<TcpStream>, Value) {
    use tungstenite::client::IntoClientRequest;
    let after = after.map_or(String::new(), |a| format!("?after={a}"));
    let mut req = format!("ws://127.0.0.2:{}/o/chat/{room}{after}", node.port)
        .into_client_request()
        .unwrap();
    let name = format!("{}{}", sub[..1].to_uppercase(), &sub[1..]);
    req.headers_mut().insert(
        "sec-websocket-protocol",
        format!("combd, combd.bearer.{}", token(sub, &name))
            .parse()
            .unwrap(),
    );
    let (mut ws, resp) = tungstenite::client(req, connect(node.public())).unwrap();
    assert_eq!(resp.headers()["sec-websocket-protocol"], "combd");
    // What the room broadcast between the upgrade and the attach comes first; the hello is
    // the room as of the attach, and includes it.
    let hello = next(&mut ws, "hello");
    assert_eq!(hello["me"], sub);
    (ws, hello)
}

fn say(ws: &mut WebSocket<TcpStream>, text: &str) {
    let m = serde_json::json!({ "t": "say", "text": text }).to_string();
    ws.send(tungstenite::Message::text(m)).unwrap();
}

/// The next message of type `t` (others, such as presence diffs, skipped).
fn next(ws: &mut WebSocket<TcpStream>, t: &str) -> Value {
    loop {
        let m = read_json(ws);
        if m["t"] == t || (t == "error" && m.get("error").is_some()) {
            return m;
        }
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
    let (mut alice, hello) = join(&node, "r1", "alice", None);
    assert_eq!(hello["presence"], serde_json::json!(["alice"]));
    assert_eq!(hello["history"], serde_json::json!([]));
    assert_eq!(hello["last"], 0);
    assert_eq!(
        next(&mut alice, "presence"),
        serde_json::json!({ "t": "presence", "join": ["alice"], "leave": [] })
    );
    let (mut bob, hello) = join(&node, "r1", "bob", None);
    assert_eq!(hello["presence"], serde_json::json!(["alice", "bob"]));
    assert_eq!(
        next(&mut alice, "presence")["join"],
        serde_json::json!(["bob"])
    );

    say(&mut alice, "hi bob");
    for ws in [&mut alice, &mut bob] {
        let m = next(ws, "msg");
        assert_eq!(
            (m["id"].as_u64(), &m["from"], &m["name"]),
            (Some(1), &"alice".into(), &"Alice".into())
        );
        assert_eq!(m["text"], "hi bob");
        assert!(m["at"].as_u64().unwrap() > 1_700_000_000_000);
    }
    say(&mut bob, "hi alice");
    assert_eq!(next(&mut alice, "msg")["id"], 2);
    // A second tab of bob's: he is in the room once, and its close does not make him leave.
    let (bob2, _) = join(&node, "r1", "bob", None);
    drop(bob2);
    bob.close(None).unwrap();
    let diff = next(&mut alice, "presence");
    assert_eq!(diff["leave"], serde_json::json!(["bob"]), "{diff}");
    assert_eq!(diff["join"], serde_json::json!([]));
    let got = request(
        node.public(),
        b"GET /o/chat/r1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(got.status, 401, "a room is for identified clients only");

    // Bad input: an error to the sender, nothing stored.
    say(&mut alice, &"x".repeat(4097));
    assert!(next(&mut alice, "error")["error"]
        .as_str()
        .unwrap()
        .contains("4096"));
    say(&mut alice, "");
    next(&mut alice, "error");
    say(&mut alice, "still here");
    assert_eq!(
        next(&mut alice, "msg")["id"],
        3,
        "ids go up by one per stored message"
    );
}

#[test]
fn a_client_cut_off_resumes_with_after_and_sees_every_message_once() {
    let file = key_file();
    let node = start(&file);
    let (mut alice, _) = join(&node, "r2", "alice", None);
    let (mut bob, _) = join(&node, "r2", "bob", None);
    for i in 0..3 {
        say(&mut alice, &format!("before {i}"));
    }
    let mut seen: Vec<u64> = (0..3)
        .map(|_| next(&mut bob, "msg")["id"].as_u64().unwrap())
        .collect();
    for _ in 0..3 {
        next(&mut alice, "msg");
    }
    drop(bob); // cut, without a close
    for i in 0..5 {
        say(&mut alice, &format!("while away {i}"));
        assert_eq!(next(&mut alice, "msg")["text"], format!("while away {i}"));
    }
    // Every message up to 8 is stored (alice saw each come back): the hello carries 4 to 8.
    let (mut bob, hello) = join(&node, "r2", "bob", Some(*seen.last().unwrap()));
    seen.extend(ids(&hello["history"]));
    assert!(hello.get("gap").is_none());
    say(&mut alice, "welcome back");
    seen.push(next(&mut bob, "msg")["id"].as_u64().unwrap());
    assert_eq!(
        seen,
        (1..=9).collect::<Vec<_>>(),
        "every message once, in order"
    );
    // A fresh join gets the last 50 and what the room's last id is.
    let (_, hello) = join(&node, "r2", "carol", None);
    assert_eq!(ids(&hello["history"]), (1..=9).collect::<Vec<_>>());
    assert_eq!(hello["last"], 9);
}

#[test]
fn past_a_thousand_missed_messages_the_hello_says_gap() {
    let file = key_file();
    let node = start(&file);
    let (mut alice, _) = join(&node, "r3", "alice", None);
    // 1,001 messages in bursts that fit the room's mailbox, each burst acknowledged by its
    // last message coming back.
    let mut sent = 0;
    while sent < 1001 {
        let burst = (1001 - sent).min(200);
        for i in 0..burst {
            say(&mut alice, &format!("m{}", sent + i));
        }
        sent += burst;
        while next(&mut alice, "msg")["id"].as_u64().unwrap() < sent as u64 {}
    }
    let (_, hello) = join(&node, "r3", "bob", Some(0));
    assert_eq!(hello["gap"], true);
    assert_eq!(ids(&hello["history"]), (952..=1001).collect::<Vec<_>>());
    let (_, hello) = join(&node, "r3", "carol", Some(1));
    assert!(hello.get("gap").is_none());
    assert_eq!(
        ids(&hello["history"]).len(),
        1000,
        "exactly the 1,000 after id 1"
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
        let (mut user, _) = join(&node, "kept", &format!("u{u}"), None);
        let until = (sent + share).min(total);
        while sent < until {
            let burst = (until - sent).min(200);
            for i in 0..burst {
                say(&mut user, &format!("m{}", sent + i));
            }
            sent += burst;
            while next(&mut user, "msg")["id"].as_u64().unwrap() < sent as u64 {}
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
    // A resume within what the node answers still finds every message.
    let after = (RETAIN + 5 - 1000) as u64;
    let (_, hello) = join(&node, "kept", "bob", Some(after));
    assert!(hello.get("gap").is_none());
    assert_eq!(ids(&hello["history"]).len(), 1000);
}

#[test]
fn a_node_killed_with_users_in_a_room_leaves_no_ghost_in_it() {
    let file = key_file();
    let node = start(&file);
    let (mut bob, _) = join(&node, "r4", "bob", None);
    say(&mut bob, "last words");
    next(&mut bob, "msg");
    let data = node.kill9();
    let s = settings(&file);
    let env: Vec<(&str, &str)> = s.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let node = TestNode::start_in(data, &env);
    let (_, hello) = join(&node, "r4", "alice", None);
    assert_eq!(
        hello["presence"],
        serde_json::json!(["alice"]),
        "bob's session died with the node"
    );
    assert_eq!(hello["history"][0]["text"], "last words");
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
fn a_resume_past_its_bytes_carries_the_last_fifty_and_says_gap() {
    let file = key_file();
    let node = start(&file);
    let (mut alice, _) = join(&node, "r5", "alice", None);
    // 200 messages of 4,096 control characters: each about 24.6 KB as JSON (escaped six bytes
    // a character), 4.9 MB in all: past the 4 MiB a resume may carry.
    let text = "\u{1}".repeat(4096);
    for burst in 1..=4u64 {
        for _ in 0..50 {
            say(&mut alice, &text);
        }
        while next(&mut alice, "msg")["id"].as_u64().unwrap() < burst * 50 {}
    }
    let (_, hello) = join(&node, "r5", "bob", Some(0));
    assert_eq!(hello["gap"], true);
    assert_eq!(ids(&hello["history"]), (151..=200).collect::<Vec<_>>());
    let (_, hello) = join(&node, "r5", "carol", Some(150));
    assert!(hello.get("gap").is_none());
    assert_eq!(ids(&hello["history"]), (151..=200).collect::<Vec<_>>());
}

#[test]
fn a_user_who_leaves_after_the_room_was_let_go_leaves_presence() {
    let file = key_file();
    let node = start(&file);
    let (mut alice, _) = join(&node, "r7", "alice", None);
    next(&mut alice, "presence");
    let (mut bob, _) = join(&node, "r7", "bob", None);
    assert_eq!(
        next(&mut alice, "presence")["join"],
        serde_json::json!(["bob"])
    );
    // Both idle: the room object is let go while their sessions stay attached.
    wait_stats(&node, "the idle room to be let go", |s| {
        s["objects_live"] == 0
    });
    // Bob closes his tab: the room is opened again for his detach, and alice sees him leave.
    bob.close(None).unwrap();
    let diff = next(&mut alice, "presence");
    assert_eq!(diff["leave"], serde_json::json!(["bob"]), "{diff}");
    // The last one out, after another idle pause, leaves an empty room.
    wait_stats(&node, "the idle room to be let go again", |s| {
        s["objects_live"] == 0
    });
    let restores = node.stats()["restores"].as_u64().unwrap();
    alice.close(None).unwrap();
    // Her detach opens the room once more, runs, and the room is let go after it.
    wait_stats(&node, "alice's detach to have run", |s| {
        s["restores"].as_u64() > Some(restores) && s["objects_live"] == 0
    });
    let (_, hello) = join(&node, "r7", "carol", None);
    assert_eq!(
        hello["presence"],
        serde_json::json!(["carol"]),
        "nobody who left is still listed"
    );
}
