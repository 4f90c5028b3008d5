//! A numbered viewer across a fleet owner's kill -9 (README "Resuming a WebSocket", "The
//! fleet"): its topic's log ships with the object's segments, so the node that restores the
//! object continues the log, and a viewer that reconnects to it with its place gets exactly the
//! broadcasts it missed, then the live stream: none lost, none twice, in order.

use std::net::TcpStream;

use tungstenite::{Message, WebSocket};

use super::support::*;
use super::*;

/// A numbered viewer of page 0 of a million board, keeping its place and what it took.
struct Viewer {
    ws: WebSocket<TcpStream>,
    epoch: u64,
    last: u64,
    placed: bool,
    /// Broadcasts taken, in order: (epoch, seq, payload).
    got: Vec<(u64, u64, String)>,
}

/// A WebSocket to `path` on `node`, once it lets one in (a dead owner's object answers 503
/// until its lease lapses and this node restores it).
fn ws_when_served(node: &TestNode, path: &str) -> WebSocket<TcpStream> {
    let started = Instant::now();
    loop {
        let url = format!("ws://127.0.0.2:{}{path}", node.port);
        let stream = connect(node.public());
        stream.set_read_timeout(Some(WAIT)).unwrap();
        match tungstenite::client(url.as_str(), stream) {
            Ok((ws, _)) => return ws,
            Err(e) => assert!(
                started.elapsed() < MOVE_WITHIN,
                "{path} was not served within {MOVE_WITHIN:?}: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl Viewer {
    fn open(node: &TestNode, board: &str) -> Viewer {
        Viewer {
            ws: ws_when_served(node, &format!("/o/million/{board}?page=0&combd_after=new")),
            epoch: 0,
            last: 0,
            placed: false,
            got: Vec::new(),
        }
    }

    fn reconnect(&mut self, node: &TestNode, board: &str) {
        let place = format!("{}.{}", self.epoch, self.last);
        self.ws = ws_when_served(
            node,
            &format!("/o/million/{board}?page=0&combd_after={place}"),
        );
        self.placed = false;
    }

    /// Takes messages until it has `n` broadcasts; a gap fails.
    fn until(&mut self, n: usize) {
        while self.got.len() < n {
            self.take();
        }
    }

    /// Takes messages until a position came on this connection.
    fn until_placed(&mut self) {
        while !self.placed {
            self.take();
        }
    }

    /// Takes the next message.
    fn take(&mut self) {
        let text = match self.ws.read().expect("a message") {
            Message::Text(t) => t.as_str().to_string(),
            Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
            _ => return,
        };
        let (header, payload) = text.split_once('|').unwrap();
        if let Some(place) = header.strip_prefix('!') {
            if header == "!presence" {
                return;
            }
            let (e, l) = place.split_once('.').unwrap();
            let (e, l): (u64, u64) = (e.parse().unwrap(), l.parse().unwrap());
            assert!(payload != "snapshot", "its place was gone: {text}");
            if payload != "resumed" {
                self.last = l;
            }
            (self.epoch, self.placed) = (e, true);
            return;
        }
        if header.is_empty() || !self.placed {
            return;
        }
        let seq: u64 = header.parse().unwrap();
        assert!(seq <= self.last + 1, "a gap: {seq} after {}", self.last);
        if seq == self.last + 1 {
            self.last = seq;
            self.got.push((self.epoch, seq, payload.to_string()));
        }
    }
}

/// Clicks `n` boxes from `from` on a WebSocket of page 0 of `board`, each acknowledged by its
/// broadcast (committed).
fn click(ws: &mut WebSocket<TcpStream>, from: u64, n: u64) {
    for c in from..from + n {
        let i = c % 4096;
        ws.send(Message::text(format!(r#"{{"t":"click","i":{i},"c":{c}}}"#)))
            .unwrap();
        loop {
            let m = read_json(ws);
            if m["t"] == "set" && m["u"].as_array().unwrap().iter().any(|u| u[3] == c) {
                break;
            }
        }
    }
}

/// Checks that `viewer` ends with every broadcast of `board`'s log on `node` once, in order,
/// under one epoch, and with `clicks` clicks in all: the log's newest frame as a new viewer is
/// told it, and every frame as a viewer from place 0 of the viewer's epoch gets them.
fn ends_with_the_log(viewer: &mut Viewer, node: &TestNode, board: &str, clicks: usize) {
    let mut log = Viewer::open(node, board);
    log.until_placed();
    let newest = log.last;
    let mut whole = Viewer {
        ws: ws_when_served(
            node,
            &format!("/o/million/{board}?page=0&combd_after={}.0", viewer.epoch),
        ),
        epoch: viewer.epoch,
        last: 0,
        placed: false,
        got: Vec::new(),
    };
    whole.until(newest as usize);
    viewer.until(newest as usize);
    assert_eq!(
        viewer.got, whole.got,
        "the viewer got every broadcast of the log once, in order"
    );
    assert!(
        viewer.got.iter().all(|(e, _, _)| *e == viewer.epoch),
        "one epoch: the log went on"
    );
    let taken: usize = viewer
        .got
        .iter()
        .map(|(_, _, p)| {
            serde_json::from_str::<serde_json::Value>(p).unwrap()["u"]
                .as_array()
                .unwrap()
                .len()
        })
        .sum();
    assert_eq!(taken, clicks, "every acknowledged click, once");
}

#[test]
fn a_numbered_viewer_resumes_on_the_next_owner_after_a_kill_9_with_every_broadcast_once() {
    let Some(fleet) = Fleet::start("a_numbered_viewer_resumes_on_the_next_owner") else {
        return;
    };
    let a = fleet.node();
    let b = fleet.node();
    let board = "fresume";
    let mut viewer = Viewer::open(&a, board);
    let mut clicker = ws_when_served(&a, &format!("/o/million/{board}?page=0"));
    read_json(&mut clicker);
    click(&mut clicker, 1, 20);
    viewer.until(1);
    // The owner dies with the viewer on it; every click was acknowledged by its broadcast.
    drop(clicker);
    drop(a.kill9());
    // Clicks go on at the next owner once it restored the board; the viewer comes back there
    // with its place.
    let mut clicker = ws_when_served(&b, &format!("/o/million/{board}?page=0"));
    read_json(&mut clicker);
    click(&mut clicker, 21, 20);
    viewer.reconnect(&b, board);
    click(&mut clicker, 41, 10);
    ends_with_the_log(&mut viewer, &b, board, 50);
}

/// A numbered viewer across a partition: its node is cut off from etcd while the viewer is on
/// it, another node serves the board once the cut node's lease lapsed, and the viewer ends with
/// every broadcast of the log once, in order: it is closed where it stalled (the cut node can
/// acknowledge nothing, and then owns nothing) and resumes at the owner with its place.
#[test]
fn a_numbered_viewer_on_a_cut_off_node_resumes_at_the_new_owner_with_every_broadcast_once() {
    let Some(fleet) = Fleet::start("a_numbered_viewer_on_a_cut_off_node") else {
        return;
    };
    let etcd: url_like::Endpoint = fleet.etcd.endpoint.parse().unwrap();
    let link = Proxy::start(etcd.addr);
    let a = fleet.node_on(
        LEASE_TTL,
        &fleet.s3.bucket.endpoint,
        &[("COMBD_FLEET_ETCD", &link.url())],
    );
    let b = fleet.node();
    let board = "fcut";
    let mut viewer = Viewer::open(&a, board);
    let mut clicker = ws_when_served(&a, &format!("/o/million/{board}?page=0"));
    read_json(&mut clicker);
    click(&mut clicker, 1, 10);
    viewer.until(1);
    drop(clicker);
    link.set_cut(true);
    // Clicks go on at B once A's lease lapsed there and B claimed the board.
    let cut = Instant::now();
    while stat(&b, "fleet_claims_won") == 0 {
        let _ = request(
            b.public(),
            format!("GET /o/million/{board}?page=0 HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        );
        assert!(cut.elapsed() < MOVE_WITHIN, "B never claimed the board");
        std::thread::sleep(Duration::from_millis(100)); // polling another process's counter
    }
    let mut clicker = ws_when_served(&b, &format!("/o/million/{board}?page=0"));
    read_json(&mut clicker);
    click(&mut clicker, 11, 10);
    link.set_cut(false);
    click(&mut clicker, 21, 5);
    // The viewer was on A all along: it is closed there and comes back with its place, as its
    // client does (to A, which passes it on to the owner now).
    let closed = Instant::now();
    let how = loop {
        match viewer.ws.read() {
            Ok(Message::Close(c)) => break format!("{c:?}"),
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => break format!("{e}"),
            Ok(_) => {}
        }
        assert!(
            closed.elapsed() < MOVE_WITHIN,
            "the stalled viewer was never closed"
        );
    };
    assert!(how.contains("Again") && how.contains("lease lost"), "{how}");
    assert!(stat(&a, "ws_lease_lost_closed") >= 1);
    viewer.reconnect(&a, board);
    ends_with_the_log(&mut viewer, &b, board, 25);
}
