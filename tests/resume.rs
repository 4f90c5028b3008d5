//! Numbered sessions (`combd_after`, README "Resuming a WebSocket"): a viewer that reconnects,
//! after a dropped connection or a kill -9 of the node, gets exactly the broadcasts it missed
//! from its object's log, in order, none twice, none lost, then the live stream; a place that
//! is gone gets a snapshot and is told so; a bad or future place is refused.
//!
//! Each test compares a numbered viewer with a plain one that stayed: the plain viewer's
//! broadcasts, in order, are what was committed; the numbered viewer must end with the same.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;

use support::*;
use tungstenite::{Message, WebSocket};

/// A numbered viewer as the protocol asks a client to be: its log's epoch, its last frame,
/// and the broadcasts it took, in order.
struct Numbered {
    ws: WebSocket<TcpStream>,
    epoch: u64,
    last: u64,
    /// A position came on this connection: numbers count from it.
    placed: bool,
    got: Vec<String>,
    /// Positions seen, as sent (`!<epoch>.<last>|<why>`).
    positions: Vec<String>,
}

impl Numbered {
    /// A viewer of page 0 of `board`: new, or after its place.
    fn open(node: &TestNode, board: &str, place: Option<(u64, u64)>) -> WebSocket<TcpStream> {
        let after = place.map_or("new".to_string(), |(e, s)| format!("{e}.{s}"));
        open_ws(
            node,
            &format!("/o/million/{board}?page=0&combd_after={after}"),
        )
    }

    fn new(node: &TestNode, board: &str) -> Numbered {
        Numbered::on(Numbered::open(node, board, None))
    }

    /// A viewer on `ws`, with no place yet.
    fn on(ws: WebSocket<TcpStream>) -> Numbered {
        Numbered {
            ws,
            epoch: 0,
            last: 0,
            placed: false,
            got: Vec::new(),
            positions: Vec::new(),
        }
    }

    /// Reconnects with its place.
    fn reconnect(&mut self, node: &TestNode, board: &str) {
        self.ws = Numbered::open(node, board, Some((self.epoch, self.last)));
        self.placed = false;
    }

    /// Takes the next message: a broadcast only if it is the next of its place; a gap fails.
    fn take(&mut self) {
        let m = self.ws.read().expect("a message");
        self.take_message(m);
    }

    /// Takes `m` as [`Numbered::take`] does; false if it is a close.
    fn take_message(&mut self, m: Message) -> bool {
        let text = match m {
            Message::Text(t) => t.as_str().to_string(),
            Message::Binary(b) => String::from_utf8(b.to_vec()).unwrap(),
            Message::Close(_) => return false,
            _ => return true,
        };
        let (header, payload) = text.split_once('|').expect("a header before |");
        if let Some(place) = header.strip_prefix('!') {
            let (epoch, last) = place.split_once('.').unwrap();
            let (epoch, last): (u64, u64) = (epoch.parse().unwrap(), last.parse().unwrap());
            self.positions.push(text.clone());
            if payload != "resumed" {
                self.last = last;
            }
            (self.epoch, self.placed) = (epoch, true);
            return true;
        }
        if header.is_empty() || !self.placed {
            return true; // a message to this session alone, or a broadcast from before its place
        }
        let seq: u64 = header.parse().unwrap();
        assert!(seq <= self.last + 1, "a gap: {} after {}", seq, self.last);
        if seq == self.last + 1 {
            self.last = seq;
            self.got.push(payload.to_string());
        }
        true
    }

    /// Takes messages until it has `n` broadcasts.
    fn until(&mut self, n: usize) {
        while self.got.len() < n {
            self.take();
        }
    }
}

/// A plain viewer of page 0 of `board` that clicks; its broadcasts, in order.
struct Plain {
    ws: WebSocket<TcpStream>,
    got: Vec<String>,
}

impl Plain {
    fn new(node: &TestNode, board: &str) -> Plain {
        let mut ws = open_ws(node, &format!("/o/million/{board}?page=0"));
        assert_eq!(read_json(&mut ws)["t"], "page");
        Plain {
            ws,
            got: Vec::new(),
        }
    }

    /// Clicks `n` boxes, and waits until it saw every click broadcast (each is committed).
    fn click(&mut self, n: u64) {
        let before = self.updates();
        for i in 0..n {
            let click = format!(r#"{{"t":"click","i":{},"c":{}}}"#, i % 4096, before + i);
            self.ws.send(Message::text(click)).unwrap();
        }
        while self.updates() < before + n {
            match self.ws.read().expect("a broadcast") {
                Message::Text(t) => self.got.push(t.as_str().to_string()),
                _ => continue,
            }
        }
    }

    /// Clicks seen in its broadcasts (several may share one frame).
    fn updates(&self) -> u64 {
        self.got
            .iter()
            .map(|f| {
                let v: serde_json::Value = serde_json::from_str(f).unwrap();
                v["u"].as_array().unwrap().len() as u64
            })
            .sum()
    }
}

#[test]
fn a_viewer_that_reconnects_gets_every_broadcast_it_missed_once_in_order() {
    let node = TestNode::start(&[("COMBD_SHARDS", "2")]);
    let mut plain = Plain::new(&node, "r1");
    let mut v = Numbered::new(&node, "r1");
    // Its first position says where the log is: none yet.
    v.take();
    v.take();
    assert_eq!(v.positions, ["!0.0|new"]);
    plain.click(40);
    v.until(plain.got.len());
    assert_eq!(
        v.got, plain.got,
        "live, numbered from the log's first frame"
    );
    let epoch = v.epoch;
    assert!(epoch > 0);
    // Gone for 60 clicks.
    v.ws.close(None).unwrap();
    plain.click(60);
    v.reconnect(&node, "r1");
    plain.click(20);
    v.until(plain.got.len());
    assert_eq!(v.got, plain.got, "every broadcast once, in order");
    // The log's first frame came after the position that says it begins; the reconnection's
    // position says the frames after its place follow.
    assert_eq!(v.positions[1], format!("!{epoch}.0|new"));
    let resumed = v.positions.last().unwrap();
    assert!(
        resumed.starts_with(&format!("!{epoch}.")),
        "{:?}",
        v.positions
    );
    assert!(resumed.ends_with("|resumed"), "{:?}", v.positions);
    let s = node.stats();
    assert!(s["topic_log_frames"].as_u64().unwrap() >= plain.got.len() as u64);
}

#[test]
fn a_viewer_resumes_across_a_kill_9_of_the_node() {
    let node = TestNode::start(&[]);
    let mut plain = Plain::new(&node, "r2");
    let mut v = Numbered::new(&node, "r2");
    plain.click(30);
    v.until(plain.got.len());
    v.ws.close(None).unwrap();
    // Committed while it was away (each click seen broadcast), then the node dies.
    plain.click(50);
    let committed = plain.got.clone();
    let data = node.kill9();
    let node = TestNode::start_in(data, &[]);
    v.reconnect(&node, "r2");
    v.until(committed.len());
    assert_eq!(
        v.got, committed,
        "the log survived the kill with what was sent"
    );
    // And the live stream goes on after the replay, numbered on.
    let mut plain = Plain::new(&node, "r2");
    plain.click(5);
    v.until(committed.len() + plain.got.len());
    assert_eq!(v.got[committed.len()..], plain.got[..]);
}

/// The status and body of a refused upgrade.
fn refused(node: &TestNode, path: &str) -> (u16, String) {
    match upgrade(node, path) {
        Ok(_) => panic!("{path}: upgraded"),
        Err(refused) => refused,
    }
}

/// A WebSocket to `path`, or the status and body of its refused upgrade.
fn upgrade(node: &TestNode, path: &str) -> Result<WebSocket<TcpStream>, (u16, String)> {
    let url = format!("ws://127.0.0.2:{}{path}", node.port);
    match tungstenite::client(url.as_str(), connect(node.public())) {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => Err((
            resp.status().as_u16(),
            String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(e) => panic!("{path}: {e}"),
    }
}

#[test]
fn a_place_that_is_gone_gets_a_snapshot_and_a_bad_one_is_refused() {
    let node = TestNode::start(&[]);
    let mut plain = Plain::new(&node, "r3");
    let mut v = Numbered::new(&node, "r3");
    plain.click(3);
    v.until(plain.got.len());
    let (epoch, last) = (v.epoch, v.last);
    // Another epoch (a forged place, or a log that started over): the page, and a snapshot.
    let mut other = Numbered::new(&node, "r3");
    other.ws = Numbered::open(&node, "r3", Some((epoch + 1, 1)));
    other.take();
    assert_eq!(other.positions, [format!("!{epoch}.{last}|snapshot")]);
    let page: serde_json::Value = match other.ws.read().unwrap() {
        Message::Text(t) => serde_json::from_str(t.as_str().strip_prefix('|').unwrap()).unwrap(),
        m => panic!("{m:?}"),
    };
    assert_eq!(page["t"], "page", "the app's attach gives the state");
    // Ahead of the log: no client could have it.
    let (status, body) = refused(
        &node,
        &format!("/o/million/r3?page=0&combd_after={epoch}.{}", last + 1),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("ahead of the log"), "{body}");
    // Not a place; twice; an app that keeps no log.
    for (path, says) in [
        ("/o/million/r3?combd_after=banana", "combd_after: expected"),
        (
            "/o/million/r3?combd_after=new&combd_after=new",
            "combd_after: given twice",
        ),
        ("/o/echo/x?combd_after=new", "keeps no log"),
    ] {
        let (status, body) = refused(&node, path);
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }
}

const SLOW: [u8; 4] = [127, 0, 5, 1];
const READER: [u8; 4] = [127, 0, 5, 2];

/// A numbered viewer of `limits/lag` from `SLOW` whose socket buffers little (4 KiB).
fn slow_viewer(node: &TestNode, after: &str) -> WebSocket<TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.bind(&std::net::SocketAddr::from((SLOW, 0)).into())
        .unwrap();
    sock.connect(&node.public().into()).unwrap();
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let url = format!(
        "ws://127.0.0.2:{}/o/limits/lag?combd_after={after}",
        node.port
    );
    tungstenite::client(url.as_str(), s).unwrap().0
}

#[test]
fn a_numbered_viewer_that_falls_behind_resumes_in_place_with_every_broadcast() {
    let node = TestNode::start(&[
        TEST_APPS,
        ("COMBD_SHARDS", "1"),
        ("COMBD_SQLITE_SYNC", "normal"),
    ]);
    let mut slow = Numbered::on(slow_viewer(&node, "new"));
    let url = format!("ws://127.0.0.2:{}/o/limits/lag", node.port);
    let (mut reader, _) = tungstenite::client(url.as_str(), connect_from(READER, node.public()))
        .expect("the reader's handshake");
    wait_stats(&node, "both attached", |s| s["sessions"] == 2);
    // The object writes once, so it has a database: its broadcasts are logged.
    let value = "POST /o/limits/lag?do=value&n=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(request(node.local(), value.as_bytes()).status, 200);
    // Rounds of 500 small broadcasts while the slow viewer reads nothing: once its socket's
    // buffers are full, its mailbox (1,000 frames) overflows and it misses frames.
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
            match reader.read().expect("the reader reads") {
                Message::Text(_) => read += 1,
                Message::Close(c) => panic!("the reader was closed: {c:?}"),
                _ => {}
            }
        }
        if node.stats()["session_mailbox_dropped"].as_u64() >= Some(1) {
            break;
        }
    }
    let s = node.stats();
    assert!(
        s["session_mailbox_dropped"].as_u64() >= Some(1),
        "no miss after {sent}: {s}"
    );
    // Now it reads: its connection, no longer stuck in its write, resumes it in place; it ends
    // with every broadcast, numbered 1 to the last with no gap (a second miss while its resume
    // was on its way would close it with 1013: it reconnects with its place).
    while slow.got.len() < sent {
        let open = match slow.ws.read() {
            Ok(m) => slow.take_message(m),
            Err(_) => false,
        };
        if !open {
            slow.ws = slow_viewer(&node, &format!("{}.{}", slow.epoch, slow.last));
            slow.placed = false;
        }
    }
    assert_eq!(slow.last, sent as u64);
    assert!(slow.got.iter().all(|p| p == "xxxxxxxx"));
    assert!(node.stats()["session_resumes"].as_u64() >= Some(1));
    assert!(
        slow.positions.iter().any(|p| p.ends_with("|resumed")),
        "{:?}",
        slow.positions
    );
}

/// A numbered viewer of `limits/<object>` after `after`, or the status of its refused upgrade.
fn try_viewer(node: &TestNode, object: &str, after: &str) -> Result<WebSocket<TcpStream>, u16> {
    upgrade(node, &format!("/o/limits/{object}?combd_after={after}")).map_err(|(status, _)| status)
}

#[test]
fn resumes_into_one_object_past_a_batchs_budget_come_back_and_end_lossless() {
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "1")]);
    let post = |what: &str| {
        let raw =
            format!("POST /o/limits/storm?{what} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
        request(node.local(), raw.as_bytes()).status
    };
    // A log of 7 broadcasts of 100 kB: a replay from its start is 700 kB, and a batch's
    // resumes may read 1 MiB together.
    assert_eq!(post("do=value&n=1"), 200);
    assert_eq!(post("do=sends&n=7&size=100000"), 200);
    // The object held for a moment, three resumes from the log's start queue behind it and
    // run in one batch (the app's batches are of 3): one is replayed, the others refused.
    let refused = std::thread::scope(|s| {
        let hold = s.spawn(|| post("do=sleep&ms=400"));
        wait_stats(&node, "the object to be held", |s| s["cells_awake"] == 1);
        let viewers: Vec<_> = (0..3)
            .map(|_| s.spawn(|| try_viewer(&node, "storm", "0.0")))
            .collect();
        assert_eq!(hold.join().unwrap(), 200);
        viewers
            .into_iter()
            .map(|v| v.join().unwrap())
            .filter(|v| v.as_ref().err() == Some(&503))
            .count()
    });
    assert!(
        refused >= 1,
        "a batch's replays are bounded: some come back later"
    );
    let counted = node.stats()["topic_log_resumes_refused"].as_u64().unwrap();
    assert_eq!(counted, refused as u64, "each refusal counted");
    // Each, connecting again, gets every frame once, in order.
    for _ in 0..3 {
        let ws = loop {
            match try_viewer(&node, "storm", "0.0") {
                Ok(ws) => break ws,
                Err(503) => continue,
                Err(s) => panic!("refused {s}"),
            }
        };
        let mut v = Numbered::on(ws);
        v.until(7);
        assert_eq!(v.last, 7);
        assert!(v.got.iter().all(|p| p.len() == 100_000));
    }
}

/// An app that keeps a short log (`App::log_retention`; the test app `brief` keeps its topic's
/// newest 3 frames): a viewer away for fewer frames resumes, one away for more gets the app's
/// snapshot and is told so.
#[test]
fn an_apps_own_retention_decides_what_a_viewer_can_resume() {
    let node = TestNode::start(&[TEST_APPS]);
    let say = |n: u32| {
        for i in 0..n {
            let r = post(&node, "/o/brief/b", &format!("line {i}"));
            assert_eq!(r.status, 200, "{}", r.text());
        }
    };
    say(1);
    let open = |after: &str| {
        let mut ws = open_ws(&node, &format!("/o/brief/b?combd_after={after}"));
        let mut got = Vec::new();
        loop {
            let Message::Text(t) = ws.read().unwrap() else {
                continue;
            };
            let t = t.as_str().to_string();
            let done = t.starts_with('!');
            got.push(t);
            if done {
                return (ws, got);
            }
        }
    };
    let (ws, got) = open("new");
    let place = got.last().unwrap()[1..]
        .split('|')
        .next()
        .unwrap()
        .to_string();
    let epoch = place.split('.').next().unwrap().to_string();
    drop(ws);
    // Away for 2 frames (it keeps 3): resumed, with both.
    say(2);
    let (mut ws, got) = open(&place);
    assert_eq!(got, [format!("!{epoch}.3|resumed")], "no snapshot: {got:?}");
    let frames: Vec<String> = (0..2).map(|_| read_text(&mut ws)).collect();
    assert_eq!(frames, ["2|line 0", "3|line 1"]);
    drop(ws);
    // Away for 4 more (past the 3 it keeps): the app's snapshot, and told so.
    say(4);
    let (mut ws, got) = open(&format!("{epoch}.3"));
    assert_eq!(got, [format!("!{epoch}.7|snapshot")]);
    assert_eq!(read_text(&mut ws), "|{\"n\":7,\"t\":\"state\"}");
}

/// The next text message of `ws` (pings and pongs skipped).
fn read_text(ws: &mut WebSocket<TcpStream>) -> String {
    loop {
        if let Message::Text(t) = ws.read().expect("a message") {
            return t.as_str().to_string();
        }
    }
}
