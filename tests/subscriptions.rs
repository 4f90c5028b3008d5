//! Many subscriptions on one WebSocket (README "Many subscriptions on one socket"), with real
//! WebSocket clients on `GET /ws`: each subscription is attached to its own object, of any app
//! on either shard, numbered or not, with its own place in its topic's log and its own
//! presence; refusals are answered on their channel while the socket goes on; the bounds per
//! socket and on the node (a client's share) are crossed; a bad envelope closes the socket.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::net::TcpStream;

use support::*;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

/// A multiplexed socket, keeping what each channel got.
struct Mux {
    ws: WebSocket<TcpStream>,
    /// Each channel's messages, its header taken off, in order.
    got: HashMap<u32, Vec<String>>,
    /// Channels the node said it took (`+`), and ended or refused (`-`, with why).
    acked: Vec<u32>,
    ended: HashMap<u32, String>,
}

impl Mux {
    fn open(node: &TestNode) -> Mux {
        Mux::on(open_ws(node, "/ws"))
    }

    fn from(node: &TestNode, address: [u8; 4]) -> Mux {
        let stream = connect_from(address, node.public());
        let url = format!("ws://127.0.0.2:{}/ws", node.port);
        Mux::on(tungstenite::client(url.as_str(), stream).unwrap().0)
    }

    fn on(ws: WebSocket<TcpStream>) -> Mux {
        Mux {
            ws,
            got: HashMap::new(),
            acked: Vec::new(),
            ended: HashMap::new(),
        }
    }

    fn send(&mut self, text: &str) {
        self.ws.send(Message::text(text)).unwrap();
    }

    /// Subscribes `ch` to `target` (`app/name?query`) and waits for the node's answer: true
    /// if it took it.
    fn sub(&mut self, ch: u32, target: &str) -> bool {
        self.send(&format!("+{ch}|{target}"));
        self.until(|m| m.acked.contains(&ch) || m.ended.contains_key(&ch));
        self.acked.contains(&ch)
    }

    /// Reads one message and files it.
    fn read_one(&mut self) {
        let m = self.ws.read();
        let text = match m
            .unwrap_or_else(|e| panic!("timed out waiting for a message: {e}; got {:?}", self.got))
        {
            Message::Text(t) => t.as_str().to_string(),
            Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
            Message::Ping(_) | Message::Pong(_) => return,
            other => panic!("unexpected {other:?}"),
        };
        let (head, rest) = text.split_once('|').expect("a header");
        if let Some(ch) = head.strip_prefix('+') {
            assert!(rest.is_empty(), "{text}");
            self.acked.push(ch.parse().unwrap());
        } else if let Some(ch) = head.strip_prefix('-') {
            let ch = ch.parse().unwrap();
            self.acked.retain(|c| *c != ch);
            self.ended.insert(ch, rest.to_string());
        } else {
            let ch = head.parse().unwrap();
            self.got.entry(ch).or_default().push(rest.to_string());
        }
    }

    fn until(&mut self, done: impl Fn(&Mux) -> bool) {
        while !done(self) {
            self.read_one();
        }
    }

    /// Waits until channel `ch` has a message for which `f` holds; returns it.
    fn until_got(&mut self, ch: u32, f: impl Fn(&str) -> bool) -> String {
        self.until(|m| m.got.get(&ch).is_some_and(|g| g.iter().any(|s| f(s))));
        self.got[&ch].iter().find(|s| f(s)).unwrap().clone()
    }

    /// Why channel `ch` was refused or ended, as JSON.
    fn why(&mut self, ch: u32) -> serde_json::Value {
        self.until(|m| m.ended.contains_key(&ch));
        serde_json::from_str(&self.ended[&ch]).unwrap()
    }
}

/// A numbered channel's broadcasts (`<seq>|<payload>`), in order.
fn broadcasts(got: &[String]) -> Vec<(u64, String)> {
    got.iter()
        .filter(|s| !s.starts_with('!'))
        .filter_map(|s| s.split_once('|'))
        .filter_map(|(seq, p)| Some((seq.parse().ok()?, p.to_string())))
        .collect()
}

/// A click on box `i` of a million page, as its page sends it.
fn click(i: u64) -> String {
    format!(r#"{{"t":"click","i":{},"c":{}}}"#, i % 4096, i)
}

#[test]
fn one_socket_carries_subscriptions_to_objects_of_either_shard_each_numbered_or_not() {
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "2")]);
    let mut m = Mux::open(&node);
    // Objects of two apps, on either shard (by their names' hash), numbered or not.
    assert!(m.sub(1, "room/a?topic=1&combd_after=new"));
    assert!(m.sub(2, "million/b?page=0&combd_after=new"));
    assert!(m.sub(3, "room/a?topic=2"));
    assert!(m.sub(4, "room/c?topic=1&combd_after=new"));
    assert!(m.sub(5, "million/d?page=0&combd_after=new"));
    // Each numbered one is told where its log is; the room's, its topic's members (itself).
    for ch in [1, 2, 4, 5] {
        m.until_got(ch, |s| s.ends_with("|new") && s.starts_with('!'));
    }
    for ch in [1, 4] {
        let members = m.until_got(ch, |s| s.starts_with("!presence|{\"members\""));
        assert!(members.contains("\"unlisted\":0"), "{members}");
    }
    // A message goes to its channel's object only; each broadcast reaches the channels of its
    // topic only, as its one-object socket would have it (the room logs nothing: `|`).
    let mut plain = open_ws(&node, "/o/room/a?topic=1");
    m.send("1|t1 hello");
    m.send("3|t2 plain");
    m.send("4|t1 other object");
    m.send(&format!("2|{}", click(7)));
    assert_eq!(m.until_got(1, |s| s.contains("hello")), "|t1 hello");
    assert_eq!(m.until_got(3, |s| s.contains("plain")), "t2 plain");
    assert_eq!(m.until_got(4, |s| s.contains("other")), "|t1 other object");
    let update = m.until_got(2, |s| s.starts_with("1|"));
    assert!(update.contains("[[7,"), "{update}");
    assert_eq!(read_text(&mut plain), "t1 hello");
    assert!(!m.got[&1].iter().any(|s| s.contains("other object")));
    assert!(!m.got[&5].iter().any(|s| s.starts_with("1|")));
    // A viewer joining channel 1's topic is told to channel 1, and to no other.
    let joins = |m: &Mux, ch: u32| -> Vec<String> {
        let got = m.got.get(&ch).map_or(&[][..], |v| v);
        got.iter()
            .filter(|s| s.contains("\"join\":[{"))
            .cloned()
            .collect()
    };
    m.until(|m| joins(m, 1).len() == 2 && !joins(m, 4).is_empty());
    let joiner = open_ws(&node, "/o/room/a?topic=1&combd_after=new");
    m.until(|m| joins(m, 1).len() == 3);
    let new = joins(&m, 1).pop().unwrap();
    m.send("4|t1 sync");
    m.until_got(4, |s| s.contains("sync"));
    assert!(!joins(&m, 4).contains(&new), "{new}");
    let s = node.stats();
    assert_eq!(s["ws_subscriptions"], 5, "{s}");
    assert_eq!(s["fair_subscriptions_held"], 5, "{s}");
    drop((joiner, plain));
    m.ws.close(None).unwrap();
    wait_stats(&node, "every subscription ended", |s| {
        s["ws_subscriptions"] == 0 && s["fair_subscriptions_held"] == 0 && s["sessions"] == 0
    });
}

#[test]
fn each_subscription_resumes_from_its_own_place() {
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "2")]);
    let mut m = Mux::open(&node);
    assert!(m.sub(7, "million/r1?page=0&combd_after=new"));
    assert!(m.sub(8, "million/r2?page=0&combd_after=new"));
    for i in 1..=3 {
        m.send(&format!("7|{}", click(i)));
        m.send(&format!("8|{}", click(100 + i)));
    }
    let has = |m: &Mux, ch: u32, what: &str| {
        m.got
            .get(&ch)
            .is_some_and(|g| g.iter().any(|s| s.contains(what)))
    };
    m.until(|m| has(m, 7, "[3,") && has(m, 8, "[103,"));
    // Each channel's place: its log's epoch (the last position's) and its last broadcast.
    let place = |m: &Mux, ch: u32| -> (String, u64) {
        let got = &m.got[&ch];
        let pos = got.iter().rfind(|s| s.starts_with('!')).unwrap();
        let epoch = pos[1..].split('.').next().unwrap().to_string();
        (epoch, broadcasts(got).last().unwrap().0)
    };
    let ((e7, l7), (e8, l8)) = (place(&m, 7), place(&m, 8));
    m.ws.close(None).unwrap();
    // What each missed while the socket was gone: two more clicks on r1, one on r2.
    let mut writer = Mux::open(&node);
    assert!(writer.sub(1, "million/r1?page=0"));
    assert!(writer.sub(2, "million/r2?page=0"));
    for i in [4, 5] {
        writer.send(&format!("1|{}", click(i)));
    }
    writer.send(&format!("2|{}", click(104)));
    writer.until(|w| has(w, 1, "[5,") && has(w, 2, "[104,"));
    // A new socket, other channel numbers, each subscription from its own place: told it
    // resumed, then every broadcast after its place, numbered on from it, none before.
    let mut back = Mux::open(&node);
    assert!(back.sub(20, &format!("million/r1?page=0&combd_after={e7}.{l7}")));
    assert!(back.sub(21, &format!("million/r2?page=0&combd_after={e8}.{l8}")));
    back.until(|m| has(m, 20, "|resumed") && has(m, 21, "|resumed"));
    for (ch, epoch, last, clicks) in [
        (20, &e7, l7, &["[4,", "[5,"][..]),
        (21, &e8, l8, &["[104,"][..]),
    ] {
        let pos = back.got[&ch]
            .iter()
            .find(|s| s.ends_with("|resumed"))
            .unwrap()
            .clone();
        let newest: u64 = pos[1..].split(['.', '|']).nth(1).unwrap().parse().unwrap();
        assert!(
            pos.starts_with(&format!("!{epoch}.")) && newest > last,
            "{pos}"
        );
        back.until(|m| {
            broadcasts(&m.got[&ch])
                .last()
                .is_some_and(|b| b.0 == newest)
        });
        let got = broadcasts(&back.got[&ch]);
        let seqs: Vec<u64> = got.iter().map(|b| b.0).collect();
        assert_eq!(
            seqs,
            (last + 1..=newest).collect::<Vec<_>>(),
            "channel {ch}"
        );
        for c in clicks {
            assert!(
                got.iter().any(|b| b.1.contains(c)),
                "channel {ch} missed {c}: {got:?}"
            );
        }
        assert!(!got
            .iter()
            .any(|b| b.1.contains("[3,") || b.1.contains("[103,")));
    }
}

#[test]
fn an_unsubscribe_leaves_presence_and_the_channel_can_be_used_again() {
    let node = TestNode::start(&[TEST_APPS]);
    let mut watcher = Mux::open(&node);
    assert!(watcher.sub(1, "room/u?combd_after=new"));
    let mut m = Mux::open(&node);
    assert!(m.sub(5, "room/u?combd_after=new"));
    watcher.until_got(1, |s| s.starts_with("!presence|{\"join\""));
    m.send("-5|");
    m.until(|m| m.ended.get(&5).is_some_and(String::is_empty));
    watcher.until_got(1, |s| s.starts_with("!presence|{\"join\":[],\"leave\""));
    // A message to a channel no longer open is answered on it; the channel may be reused.
    m.ended.clear();
    m.send("5|t0 late");
    assert_eq!(m.why(5)["status"], 404);
    m.ended.clear();
    assert!(m.sub(5, "room/v"));
    assert_eq!(node.stats()["ws_subscriptions"], 2);
}

#[test]
fn refused_subscribes_are_answered_on_their_channel_and_the_socket_goes_on() {
    let node = TestNode::start(&[TEST_APPS]);
    let mut m = Mux::open(&node);
    let cases = [
        ("nosuch/a", 404),
        ("room/.hidden", 400),
        ("room/a/b", 400),
        ("echo/a", 400),
        ("whoami/a", 401),
        ("room/a?topic=500", 400),
        ("room/a?combd_after=7", 400),
    ];
    for (i, (target, status)) in cases.iter().enumerate() {
        let ch = 100 + i as u32;
        assert!(!m.sub(ch, target), "{target}");
        let why = m.why(ch);
        assert_eq!(why["status"], *status, "{target}: {why}");
        assert!(why["error"].is_string(), "{target}: {why}");
    }
    assert_eq!(node.stats()["ws_subscriptions_refused"], cases.len() as u64);
    assert!(m.sub(1, "room/a"));
    m.send("1|t0 still here");
    assert_eq!(m.until_got(1, |s| s.contains("still")), "t0 still here");
    assert_eq!(node.stats()["fair_subscriptions_held"], 1);
}

#[test]
fn an_identified_app_is_subscribed_with_the_sockets_token() {
    let secret = auth::key_file("mux", "combd-mux-test-secret-0123456789abcdefgh");
    let node = TestNode::start(&[
        TEST_APPS,
        ("COMBD_AUTH_JWT_KEY_FILE", secret.to_str().unwrap()),
    ]);
    let token = auth::token("combd-mux-test-secret-0123456789abcdefgh", "ann", None);
    let mut m = Mux::on(auth::open_ws_with(&node, "/ws", &token));
    assert!(m.sub(1, "whoami/x"));
    let hello = m.until_got(1, |s| s.contains("hello"));
    assert!(hello.contains("\"me\":\"ann\""), "{hello}");
    m.send("1|hi");
    m.until_got(1, |s| s.contains("seen"));
    // A bad token is refused at the upgrade: the client meant to be someone.
    let r = request(
        node.public(),
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Authorization: Bearer not.a.token\r\n\r\n",
    );
    assert_eq!(r.status, 401, "{}", r.text());
}

#[test]
fn a_socket_holds_at_most_its_subscriptions_and_a_client_its_share() {
    let node = TestNode::start(&[
        TEST_APPS,
        ("COMBD_WS_SUBSCRIPTIONS", "3"),
        ("COMBD_SUBSCRIPTIONS_MAX", "30"),
    ]);
    assert_eq!(node.stats()["limits"]["ws_subscriptions"], 3);
    assert_eq!(node.stats()["limits"]["subscriptions_max"], 30);
    let mut m = Mux::from(&node, client_address(1));
    for ch in 1..=3 {
        assert!(m.sub(ch, &format!("room/s{ch}")));
    }
    assert!(!m.sub(4, "room/s4"));
    assert_eq!(m.why(4)["status"], 429);
    assert_eq!(node.stats()["ws_subscriptions_refused"], 1);
    // The node's pool of 30, a client's share of it 10 %: a second socket of the same address
    // is refused (503) while another address subscribes.
    let mut again = Mux::from(&node, client_address(1));
    assert!(!again.sub(1, "room/s1"));
    assert_eq!(again.why(1)["status"], 503);
    let mut other = Mux::from(&node, client_address(2));
    assert!(other.sub(1, "room/s1"));
    let s = node.stats();
    assert!(
        s["fair_subscriptions_refused_share"].as_u64().unwrap() >= 1,
        "{s}"
    );
    assert!(
        s["fair_subscriptions_client_max"].as_u64().unwrap() <= 3,
        "{s}"
    );
    // Unsubscribing gives the unit back.
    m.send("-1|");
    m.until(|m| m.ended.get(&1).is_some_and(String::is_empty));
    assert!(again.sub(9, "room/s9"));
}

#[test]
fn a_bad_envelope_or_a_reused_channel_closes_the_socket_with_1008() {
    let node = TestNode::start(&[TEST_APPS]);
    for bad in ["hello", "+x|room/a", "-1|junk", "+1|room"] {
        let mut m = Mux::open(&node);
        m.send(bad);
        expect_close(&mut m.ws, CloseCode::Policy, "bad envelope");
    }
    let mut m = Mux::open(&node);
    assert!(m.sub(1, "room/a"));
    m.send("+1|room/b");
    expect_close(&mut m.ws, CloseCode::Policy, "channel in use");
    let r = request(node.public(), b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 426, "{}", r.text());
}

#[test]
fn a_subscription_setting_of_zero_fails_start_up_naming_it() {
    for name in ["COMBD_WS_SUBSCRIPTIONS", "COMBD_SUBSCRIPTIONS_MAX"] {
        let dir = std::env::temp_dir().join(format!("combd-mux-zero-{}", std::process::id()));
        let msg = refused(&mut combd_command(&dir, &[(name, "0")]));
        assert!(msg.contains(name), "{name}: {msg}");
    }
}

/// The next text message of `ws` (pings and pongs skipped).
fn read_text(ws: &mut WebSocket<TcpStream>) -> String {
    loop {
        match ws.read().expect("timed out waiting for a message") {
            Message::Text(t) => return t.as_str().to_string(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Reads until the node's close frame: its code and reason.
fn expect_close(ws: &mut WebSocket<TcpStream>, code: CloseCode, reason: &str) {
    loop {
        match ws.read() {
            Ok(Message::Close(Some(f))) => {
                assert_eq!((f.code, f.reason.as_str()), (code, reason));
                return;
            }
            Ok(Message::Close(None)) => panic!("a close without a code"),
            Ok(_) => continue,
            Err(e) => panic!("no close frame: {e}"),
        }
    }
}

/// A final masked text frame, as a client sends it.
fn masked(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    combd_shards::ws::encode_masked(&mut out, 1, payload);
    out
}

#[test]
fn a_socket_that_stops_reading_is_closed_whole_and_its_subscriptions_end() {
    use std::io::Write;
    use std::time::Instant;
    let node = TestNode::start(&[
        ("COMBD_SHARDS", "1"),
        ("COMBD_SQLITE_SYNC", "normal"),
        ("COMBD_WS_SLOW_TIMEOUT", "2s"),
        ("COMBD_WS_RATE", "100000"),
        ("COMBD_WS_BURST", "100000"),
    ]);
    // A socket that reads nothing (its receive buffer 4 KiB), three subscriptions on it.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect_timeout(&node.public().into(), WAIT).unwrap();
    let mut never: TcpStream = sock.into();
    never.set_read_timeout(Some(WAIT)).unwrap();
    upgrade_raw(&mut never, "/ws", &format!("127.0.0.2:{}", node.port));
    for ch in 1..=3 {
        never
            .write_all(&masked(format!("+{ch}|million/slow?page=0").as_bytes()))
            .unwrap();
    }
    wait_stats(&node, "three subscriptions", |s| s["ws_subscriptions"] == 3);
    let mut clicker = open_ws(&node, "/o/million/slow?page=0");
    read_text(&mut clicker);
    let click = |ws: &mut WebSocket<TcpStream>, c: u64| {
        let i = c % 4096;
        ws.send(Message::text(format!(r#"{{"t":"click","i":{i},"c":{c}}}"#)))
            .unwrap();
        while !read_text(ws).contains(&format!(",{c}]")) {}
    };
    let started = Instant::now();
    let mut c = 0;
    while node.stats()["ws_slow_closed"] == 0 {
        assert!(
            started.elapsed() < WAIT * 2,
            "the socket was never closed as slow"
        );
        for _ in 0..50 {
            c += 1;
            click(&mut clicker, c);
        }
    }
    // One budget for the socket: closed whole, each subscription ended, every byte given back.
    wait_stats(&node, "the socket's subscriptions ended", |s| {
        s["ws_subscriptions"] == 0
            && s["fair_subscriptions_held"] == 0
            && s["outbound_bytes"] == 0
            && s["ws_slow_closed"] == 1
    });
    read_until_closed(&mut never);
    click(&mut clicker, 1_000_000);
}

#[test]
fn a_subscription_that_falls_behind_resumes_in_place_alone_with_every_broadcast() {
    let node = TestNode::start(&[
        TEST_APPS,
        ("COMBD_SHARDS", "1"),
        ("COMBD_SQLITE_SYNC", "normal"),
    ]);
    // A multiplexed socket that buffers little (4 KiB) and reads nothing for a while, with a
    // numbered subscription to a busy object and a plain one to a quiet one.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.bind(&std::net::SocketAddr::from((client_address(1), 0)).into())
        .unwrap();
    sock.connect(&node.public().into()).unwrap();
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let url = format!("ws://127.0.0.2:{}/ws", node.port);
    let mut m = Mux::on(tungstenite::client(url.as_str(), s).unwrap().0);
    assert!(m.sub(1, "limits/lag?combd_after=new"));
    assert!(m.sub(2, "room/quiet"));
    let reader_url = format!("ws://127.0.0.2:{}/o/limits/lag", node.port);
    let (mut reader, _) = tungstenite::client(
        reader_url.as_str(),
        connect_from(client_address(2), node.public()),
    )
    .unwrap();
    // The object writes once, so it has a database: its broadcasts are logged.
    let value = "POST /o/limits/lag?do=value&n=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(request(node.local(), value.as_bytes()).status, 200);
    const EACH: usize = 500;
    let send = format!(
        "POST /o/limits/lag?do=sends&n={EACH}&size=8 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    );
    let mut sent = 0;
    for _ in 0..60 {
        assert_eq!(request(node.local(), send.as_bytes()).status, 200);
        sent += EACH;
        let mut read = 0;
        while read < EACH {
            if let Message::Text(_) = reader.read().expect("the reader reads") {
                read += 1;
            }
        }
        if node.stats()["session_mailbox_dropped"].as_u64() >= Some(1) {
            break;
        }
    }
    assert!(node.stats()["session_mailbox_dropped"].as_u64() >= Some(1));
    // Now it reads: channel 1 resumes in place (or, missed again before that reached it, is
    // ended 1013 and subscribed again with its place, as a client does), and ends with every
    // broadcast numbered 1 to the last, none twice, none missing; channel 2 stays.
    let (mut epoch, mut last, mut placed) = (0u64, 0u64, false);
    let mut resumed = false;
    while last < sent as u64 {
        m.got.clear();
        m.ended.clear();
        m.read_one();
        if let Some(why) = m.ended.get(&1) {
            assert!(why.contains("1013"), "{why}");
            assert!(m.sub(1, &format!("limits/lag?combd_after={epoch}.{last}")));
            placed = false;
            continue;
        }
        for text in m.got.get(&1).cloned().unwrap_or_default() {
            let (header, _) = text.split_once('|').unwrap();
            if let Some(place) = header.strip_prefix('!') {
                let (e, l) = place.split_once('.').unwrap();
                let why = text.rsplit('|').next().unwrap();
                resumed |= why == "resumed";
                if why != "resumed" {
                    last = l.parse().unwrap();
                }
                (epoch, placed) = (e.parse().unwrap(), true);
            } else if !header.is_empty() && placed {
                let seq: u64 = header.parse().unwrap();
                assert!(seq <= last + 1, "a gap: {seq} after {last}");
                last = last.max(seq);
            }
        }
    }
    assert_eq!(last, sent as u64);
    assert!(resumed, "it resumed from its log");
    assert!(node.stats()["session_resumes"].as_u64() >= Some(1));
    assert!(m.acked.contains(&2), "the quiet subscription stayed");
    m.send("2|t0 still");
    m.until_got(2, |s| s.contains("still"));
}
