//! The `/million/` page in a real browser: headless Chromium, driven over the Chrome DevTools
//! Protocol (a WebSocket, spoken with tungstenite), against the real node. Two tabs of one
//! board see each other's clicks; a node restart on the same port and data directory is
//! recovered from without a reload, the box still checked; a page that does not exist shows
//! the node's own error and is not retried; a node held at its connection cap shows "busy"
//! and recovers once released.
//!
//! Skipped, with one line, when no Chromium is found (`COMBD_CHROMIUM` names one; `.ci/run`
//! installs Debian's `chromium`). With `COMBD_SCREENSHOTS=<dir>` it also writes a PNG of each
//! state there (`million-live.png`, `-reconnecting`, `-busy`, `-invalid`, and `-phone`: live on
//! a phone-sized screen).
//!
//! Chromium only reaches 127.0.0.2 (the node's public address) and 127.0.0.1 (its DevTools
//! endpoint): every host name resolves to nothing and its background services are off.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufRead, BufReader, ErrorKind};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;
use tungstenite::{Message, WebSocket};

/// How long the page may take to recover by itself (its backoff grows to 30 s; these waits
/// cover a few steps of it).
const RECOVER: Duration = Duration::from_secs(30);

/// The Chromium to drive: `COMBD_CHROMIUM`, else Debian's binary, else one on `PATH`.
fn find_chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("COMBD_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    // Debian's /usr/bin/chromium is a shell wrapper that adds flags (and API keys); the
    // binary itself takes only ours.
    let debian = Path::new("/usr/lib/chromium/chromium");
    if debian.is_file() {
        return Some(debian.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    [
        "chromium",
        "chromium-browser",
        "google-chrome-stable",
        "google-chrome",
    ]
    .iter()
    .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
    .find(|p| p.is_file())
}

/// A headless Chromium and one DevTools connection to it; pages are attached sessions on it.
struct Browser {
    child: Child,
    cdp: WebSocket<TcpStream>,
    next_id: u64,
    profile: PathBuf,
}

/// A tab: its target and DevTools session.
struct Tab {
    target: String,
    session: String,
}

impl Browser {
    fn launch(bin: &Path) -> Browser {
        // A profile of its own per launch: two Chromiums on one profile directory (two tests
        // of this binary at once) refuse each other.
        static LAUNCHES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let profile = std::env::temp_dir().join(format!(
            "combd-chromium-{}-{}",
            std::process::id(),
            LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).unwrap();
        let mut cmd = Command::new(bin);
        cmd.args([
            "--headless",
            "--no-sandbox", // CI runs as root, where Chromium's sandbox refuses to start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-sync",
            "--disable-domain-reliability",
            "--disable-client-side-phishing-detection",
            "--disable-breakpad",
            "--no-pings",
            "--metrics-recording-only",
            "--password-store=basic",
            "--use-mock-keychain",
            "--no-proxy-server",
            // Every host but the two loopback addresses fails to resolve.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE 127.0.0.2",
            "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
            // Tabs in the background keep their timers (the page's retries).
            "--disable-background-timer-throttling",
            "--disable-renderer-backgrounding",
            "--disable-backgrounding-occluded-windows",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--window-size=1024,700",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        // Its own process group, so its helpers (renderers, zygote) end with it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().expect("spawn chromium");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Chromium's stderr is mostly noise (dbus, GPU): only its DevTools line is kept,
            // the rest is read so the pipe never fills.
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let url = match rx.recv_timeout(WAIT + WAIT) {
            Ok(url) => url,
            Err(_) => {
                kill_group(&mut child);
                panic!("timed out waiting for Chromium's DevTools line");
            }
        };
        let addr = url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .expect("DevTools URL");
        let stream = TcpStream::connect(addr).expect("connect to DevTools");
        stream.set_read_timeout(Some(WAIT)).unwrap();
        stream.set_write_timeout(Some(WAIT)).unwrap();
        let (cdp, _) = tungstenite::client(url.as_str(), stream).expect("DevTools handshake");
        Browser {
            child,
            cdp,
            next_id: 0,
            profile,
        }
    }

    /// Sends one command and waits for its answer (events in between are skipped).
    fn call(&mut self, tab: Option<&Tab>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(t) = tab {
            msg["sessionId"] = json!(t.session);
        }
        self.cdp
            .send(Message::text(msg.to_string()))
            .expect("send to DevTools");
        let deadline = Instant::now() + WAIT + WAIT;
        loop {
            assert!(Instant::now() < deadline, "timed out waiting for {method}");
            let text = match self.cdp.read() {
                Ok(Message::Text(t)) => t,
                Ok(_) => continue,
                Err(e) => panic!("timed out waiting for {method}: {e}"),
            };
            let v: Value = serde_json::from_str(text.as_str()).expect("DevTools JSON");
            if v["id"] == id {
                if let Some(err) = v.get("error") {
                    panic!("{method}: {err}");
                }
                return v["result"].clone();
            }
        }
    }

    /// Opens a tab at `url` (1024×700).
    fn open(&mut self, url: &str) -> Tab {
        self.open_sized(
            url,
            json!({ "width": 1024, "height": 700, "deviceScaleFactor": 1, "mobile": false }),
        )
    }

    /// Opens a tab at `url` on a screen of `metrics` (`Emulation.setDeviceMetricsOverride`).
    fn open_sized(&mut self, url: &str, metrics: Value) -> Tab {
        let target = self.call(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
        );
        let tab = Tab {
            target: target["targetId"].as_str().unwrap().to_string(),
            session: attached["sessionId"].as_str().unwrap().to_string(),
        };
        self.call(Some(&tab), "Emulation.setDeviceMetricsOverride", metrics);
        self.navigate(&tab, url);
        tab
    }

    fn navigate(&mut self, tab: &Tab, url: &str) {
        let r = self.call(Some(tab), "Page.navigate", json!({ "url": url }));
        assert!(r.get("errorText").is_none(), "navigate to {url}: {r}");
    }

    /// Evaluates a JavaScript expression in the tab; its value.
    fn eval(&mut self, tab: &Tab, expr: &str) -> Value {
        let r = self.call(
            Some(tab),
            "Runtime.evaluate",
            json!({ "expression": expr, "returnByValue": true }),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is true; fails with "timed out waiting for {what}" and the
    /// page's state after `limit`.
    fn wait_for(&mut self, tab: &Tab, what: &str, expr: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            // Before the page's script ran, `million` is not there yet: not true.
            if self.eval(
                tab,
                &format!(
                    "(() => {{ try {{ return !!({expr}); }} catch (_) {{ return false; }} }})()"
                ),
            ) == true
            {
                return;
            }
            if Instant::now() >= deadline {
                let state = self.eval(
                    tab,
                    "JSON.stringify({ url: location.href, status: document.getElementById('status')?.textContent, seen: window.million?.seen })",
                );
                panic!("timed out waiting for {what}: {state}");
            }
            // The DOM has no event to wait on from here: poll it, briefly.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The tab's state as the page shows it.
    fn state(&mut self, tab: &Tab) -> String {
        self.eval(tab, "document.body.dataset.state")
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Clicks the middle of the element `selector` with the mouse (the tab in front).
    fn click(&mut self, tab: &Tab, selector: &str) {
        self.call(Some(tab), "Page.bringToFront", json!({}));
        let r = self.eval(
            tab,
            &format!(
                "(() => {{ const r = document.querySelector({selector:?}).getBoundingClientRect(); \
                 return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
            ),
        );
        let (x, y) = (r[0].as_f64().unwrap(), r[1].as_f64().unwrap());
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                Some(tab),
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            );
        }
    }

    /// Types `text` into the page number box, replacing what it held, and presses Enter (the
    /// tab in front).
    fn enter_page(&mut self, tab: &Tab, text: &str) {
        self.call(Some(tab), "Page.bringToFront", json!({}));
        self.eval(tab, "document.getElementById('page').select()");
        self.call(Some(tab), "Input.insertText", json!({ "text": text }));
        for kind in ["keyDown", "keyUp"] {
            self.call(
                Some(tab),
                "Input.dispatchKeyEvent",
                json!({ "type": kind, "key": "Enter", "code": "Enter",
                        "windowsVirtualKeyCode": 13, "text": "\r" }),
            );
        }
    }

    /// A PNG of the tab's viewport, decoded: the tab is brought to the front and two frames
    /// are drawn first (a tab behind draws none).
    fn screenshot(&mut self, tab: &Tab) -> Vec<u8> {
        self.call(Some(tab), "Page.bringToFront", json!({}));
        self.call(
            Some(tab),
            "Runtime.evaluate",
            json!({ "expression": "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))",
                    "awaitPromise": true }),
        );
        let r = self.call(
            Some(tab),
            "Page.captureScreenshot",
            json!({ "format": "png" }),
        );
        base64_decode(r["data"].as_str().expect("screenshot data"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.cdp.send(Message::text(
            json!({ "id": 0, "method": "Browser.close" }).to_string(),
        ));
        kill_group(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Ends Chromium and its helpers: SIGKILL to the process group it leads.
fn kill_group(child: &mut Child) {
    // The process group of our own child, which leads it.
    let pgrp = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::killpg(pgrp, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for &c in s.as_bytes().iter().filter(|&&c| c != b'=') {
        acc = (acc << 6) | u32::from(val(c));
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// Where to write screenshots, if asked (`COMBD_SCREENSHOTS`).
struct Shots(Option<PathBuf>);

impl Shots {
    fn from_env() -> Shots {
        let dir = std::env::var_os("COMBD_SCREENSHOTS").map(PathBuf::from);
        if let Some(d) = &dir {
            std::fs::create_dir_all(d).unwrap();
        }
        Shots(dir)
    }

    /// Saves a screenshot of the tab as `million-<state>.png`, once the tab shows `state`,
    /// checking that it still does after the capture (so the picture is of that state).
    /// True when the picture is of that state (or none was asked for).
    fn take(&self, b: &mut Browser, tab: &Tab, state: &str) -> bool {
        self.take_as(b, tab, state, state)
    }

    /// The same, saved as `million-<name>.png`.
    fn take_as(&self, b: &mut Browser, tab: &Tab, state: &str, name: &str) -> bool {
        let Some(dir) = &self.0 else { return true };
        let before = b.eval(tab, "JSON.stringify([million.state, million.changes])");
        let png = b.screenshot(tab);
        let after = b.eval(tab, "JSON.stringify([million.state, million.changes])");
        if before != after || before.as_str().is_none_or(|s| !s.contains(state)) {
            eprintln!("screenshot of {state} not kept: the page went from {before} to {after}");
            return false;
        }
        assert_eq!(&png[1..4], b"PNG");
        std::fs::write(dir.join(format!("million-{name}.png")), png).unwrap();
        true
    }
}

/// Connections held open without a request, until the node's public listeners stop.
fn fill_to_the_cap(node: &TestNode) -> Vec<TcpStream> {
    let mut held = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        if all_public_listeners_stopped(&node.stats()) {
            return held;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the node to stop listening"
        );
        match TcpStream::connect(node.public()) {
            Ok(s) => held.push(s),
            // Refused: the listeners are stopping; the next look at /stats says so.
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("connect: {e}"),
        }
    }
}

const BOX: usize = 17;

fn box_checked(i: usize) -> String {
    format!("document.querySelectorAll('#grid input')[{i}]?.checked === true")
}

#[test]
fn million_page_recovers_by_itself_in_chromium() {
    let Some(bin) = find_chromium() else {
        support::skipped("no Chromium found (apt-get install chromium, or set COMBD_CHROMIUM)");
        return;
    };
    let started = Instant::now();
    let shots = Shots::from_env();
    // A small connection cap, for the busy part; idle sockets may wait a minute for a head.
    let settings = [("COMBD_MAX_CONNS", "24"), ("COMBD_HEADER_TIMEOUT", "1m")];
    let mut node = TestNode::start(&settings);
    let port = node.port;
    let base = format!("http://127.0.0.2:{port}/million/");
    let mut b = Browser::launch(&bin);

    // Two tabs on page 3 of one board: a click in one is seen in the other.
    let url = format!("{base}?board=browser-test&page=3");
    let one = b.open(&url);
    let two = b.open(&url);
    for tab in [&one, &two] {
        b.wait_for(tab, "the page to be live", "million.state === 'live'", WAIT);
        assert_eq!(b.eval(tab, "location.search"), "?board=browser-test&page=3");
    }
    b.click(&one, &format!("#grid input:nth-child({})", BOX + 1));
    b.wait_for(
        &two,
        "the click to reach the other tab",
        &box_checked(BOX),
        WAIT,
    );
    b.wait_for(&one, "the click to come back", &box_checked(BOX), WAIT);
    let count = b.eval(&one, "document.getElementById('count').textContent");
    assert_eq!(count, "1 of 4096 boxes checked on page 3");
    // Chromium offers permessage-deflate: both tabs' WebSockets took it, and the page's state
    // (4,096 boxes in hex) came compressed.
    let stats = node.stats();
    assert!(
        stats["ws_deflate_opened"].as_u64() >= Some(2),
        "{}",
        stats["ws_deflate_opened"]
    );
    assert!(
        stats["ws_deflated_out"].as_u64() >= Some(2),
        "{}",
        stats["ws_deflated_out"]
    );
    assert!(shots.take(&mut b, &one, "live"));

    // On a phone's screen the page is laid out for it (the viewport tag), with boxes big
    // enough to tap.
    let phone = b.open_sized(
        &url,
        // A phone's layout; drawn at scale 1: at 2, headless Chromium's software raster was
        // seen to draw a checked box twice in the picture.
        json!({ "width": 390, "height": 800, "deviceScaleFactor": 1, "mobile": true }),
    );
    b.wait_for(
        &phone,
        "the page to be live",
        "million.state === 'live'",
        WAIT,
    );
    b.wait_for(
        &phone,
        "the page to be laid out for a phone",
        "document.documentElement.clientWidth === 390 && \
         document.querySelector('#grid input').getBoundingClientRect().width >= 20",
        WAIT,
    );
    b.wait_for(&phone, "the box to show", &box_checked(BOX), WAIT);
    assert!(shots.take_as(&mut b, &phone, "live", "phone"));
    b.call(
        None,
        "Target.closeTarget",
        json!({ "targetId": phone.target }),
    );

    // Restart the node on the same port and data directory: the tabs say so, and come back
    // live by themselves, the box still checked.
    let mut reconnecting_shot = false;
    for _ in 0..3 {
        let seen = [&one, &two].map(|tab| b.eval(tab, "million.seen.length"));
        node.sigterm();
        for (i, (tab, n)) in [&one, &two].into_iter().zip(seen).enumerate() {
            b.wait_for(
                tab,
                "the page to say it is reconnecting",
                &format!("million.seen.slice({n}).includes('reconnecting')"),
                WAIT,
            );
            if i == 0 {
                // The page retries within half a second, and a picture may miss the state:
                // then restart again for it.
                reconnecting_shot = shots.take(&mut b, tab, "reconnecting");
            }
        }
        node.wait_exit();
        // The node closed with 1001 and is not there: two more attempts find nothing, and
        // the page still says it is reconnecting to a restarting node (not "busy").
        let attempts = b.eval(&one, "million.attempts").as_u64().unwrap();
        b.wait_for(
            &one,
            "two attempts while the node is down",
            &format!("million.attempts >= {}", attempts + 2),
            WAIT,
        );
        assert_eq!(b.state(&one), "reconnecting");
        let why = b.eval(&one, "million.why");
        assert_eq!(why, "the node is restarting", "the last retry's reason");
        let data = std::mem::take(&mut node.data_dir);
        drop(node);
        let listen = format!("127.0.0.2:{port}");
        let mut env = settings.to_vec();
        env.push(("COMBD_LISTEN", &listen));
        node = TestNode::start_in(data, &env);
        for tab in [&one, &two] {
            b.wait_for(
                tab,
                "the page to be live again",
                "million.state === 'live'",
                RECOVER,
            );
            b.wait_for(
                tab,
                "the box to be checked after the restart",
                &box_checked(BOX),
                WAIT,
            );
            // The page resumed from its place in the page's log, its grid kept: not reloaded.
            assert!(
                b.eval(tab, "million.resumes").as_u64() >= Some(1),
                "the page resumed"
            );
        }
        if reconnecting_shot {
            break;
        }
    }
    assert!(
        reconnecting_shot,
        "no screenshot of the reconnecting state in 3 restarts"
    );
    let seen = b.eval(&one, "million.seen.join(' ')");
    assert!(
        seen.as_str().unwrap().contains("live reconnecting"),
        "{seen}"
    );
    // A node that closed with 1001 and is not there yet is restarting, not busy.
    assert!(!seen.as_str().unwrap().contains("busy"), "{seen}");

    // A page that does not exist: the node's own error, and no retry.
    b.enter_page(&one, "245");
    b.wait_for(
        &one,
        "the invalid page to be shown",
        "million.state === 'invalid'",
        WAIT,
    );
    let status = b.eval(&one, "document.getElementById('status').textContent");
    assert!(
        status.as_str().unwrap().contains("page must be below 245"),
        "{status}"
    );
    assert_eq!(
        b.eval(&one, "location.search"),
        "?board=browser-test&page=245"
    );
    assert_eq!(
        b.eval(&one, "document.querySelectorAll('#grid input').length"),
        0
    );
    assert!(shots.take(&mut b, &one, "invalid"));
    let changes = b.eval(&one, "million.changes");

    // Invalid boards are caught before anything is sent (so `../counter/visits` never
    // reaches another app), and a negative page gets the node's error.
    for (query, says) in [
        ("board=..%2Fcounter%2Fvisits", "board names are"),
        ("board=a%23b", "board names are"),
        ("board=browser-test&page=-1", "page must be a whole number"),
    ] {
        b.navigate(&two, &format!("{base}?{query}"));
        b.wait_for(&two, query, "million.state === 'invalid'", WAIT);
        let status = b.eval(&two, "document.getElementById('status').textContent");
        assert!(status.as_str().unwrap().contains(says), "{query}: {status}");
    }

    // The node at its connection cap: going to a page shows "busy", then live once released.
    let held = fill_to_the_cap(&node);
    assert_eq!(
        b.eval(&one, "million.changes"),
        changes,
        "the invalid page was retried"
    );
    b.click(&one, "#prev");
    b.wait_for(
        &one,
        "the page to say the node is busy",
        "million.state === 'busy'",
        WAIT,
    );
    let status = b.eval(&one, "document.getElementById('status').textContent");
    assert!(
        status.as_str().unwrap().contains("node busy, retrying in"),
        "{status}"
    );
    assert_eq!(
        b.eval(
            &one,
            "getComputedStyle(document.getElementById('grid')).pointerEvents"
        ),
        "none"
    );
    assert!(shots.take(&mut b, &one, "busy"));
    drop(held);
    b.wait_for(
        &one,
        "the page to recover from busy",
        "million.state === 'live'",
        RECOVER,
    );
    assert_eq!(
        b.eval(&one, "location.search"),
        "?board=browser-test&page=244"
    );
    assert_eq!(b.state(&one), "live");
    eprintln!("browser test took {:.1} s", started.elapsed().as_secs_f64());
}

/// What the page relies on from the node, without a browser: redirects to it, and the
/// reason a refused upgrade gets, which the page asks for over plain HTTP.
#[test]
fn million_page_routes_and_reasons() {
    let node = TestNode::start(&[]);
    let get = |target: &str, upgrade: bool| {
        let up = if upgrade {
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        } else {
            ""
        };
        request(
            node.public(),
            format!("GET {target} HTTP/1.1\r\nHost: x\r\n{up}\r\n").as_bytes(),
        )
    };
    for (from, status, to) in [
        ("/", 302, "/million/"),
        ("/?board=x&page=5", 302, "/million/?board=x&page=5"),
        ("/million", 308, "/million/"),
        ("/million?board=x", 308, "/million/?board=x"),
    ] {
        let r = get(from, false);
        assert_eq!(r.status, status, "{from}");
        assert_eq!(r.header("location"), Some(to), "{from}");
    }
    let r = request(
        node.public(),
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(r.status, 405);
    let page = get("/million/", false).text();
    for needed in [
        "<meta name=\"viewport\"",
        "<link rel=\"icon\" href=\"data:,\">",
        "encodeURIComponent(board)",
        "history.replaceState",
    ] {
        assert!(page.contains(needed), "the page lacks {needed}");
    }
    // A refused upgrade and a plain GET of the same target give the same reason.
    for (target, status, reason) in [
        ("/o/million/b?page=245", 400, "page must be below 245"),
        ("/o/million/b?page=-1", 400, "page must be a whole number"),
        ("/o/million/.b?page=0", 400, "invalid object name"),
        ("/o/million/a%23b?page=0", 400, "invalid object name"),
    ] {
        for upgrade in [true, false] {
            let r = get(target, upgrade);
            assert_eq!(r.status, status, "{target} upgrade={upgrade}");
            assert!(
                r.json()["error"].as_str().unwrap().contains(reason),
                "{target}: {}",
                r.text()
            );
        }
    }
    assert_eq!(get("/o/million/b?page=244", false).json()["pages"], 245);
    assert_eq!(get("/o/million/b", false).status, 200);
}

/// Cross-site WebSocket hijacking, tried by a real browser: a page of another origin (the
/// node's localhost listener, `http://127.0.0.1:<port>`, is another origin than the public
/// `http://127.0.0.2:<port>`) cannot open a WebSocket to the public listener nor `POST` to an
/// object there; the same page can on its own origin.
#[test]
fn a_page_of_another_origin_cannot_open_a_websocket_or_post_in_chromium() {
    let Some(bin) = find_chromium() else {
        support::skipped("no Chromium found (apt-get install chromium, or set COMBD_CHROMIUM)");
        return;
    };
    let node = TestNode::start(&[]);
    let port = node.port;
    let mut b = Browser::launch(&bin);
    let tab = b.open(&format!(
        "http://127.0.0.1:{port}/million/?board=origin-test"
    ));
    b.wait_for(
        &tab,
        "the page to be live",
        "million.state === 'live'",
        WAIT,
    );
    // Each attempt leaves its outcome in window.tried: "open", or the close code.
    b.eval(
        &tab,
        &format!(
            "window.tried = {{}}; \
             for (const [name, url] of [['own', 'ws://127.0.0.1:{port}/o/echo/x'], \
                                        ['foreign', 'ws://127.0.0.2:{port}/o/echo/x']]) {{ \
               const ws = new WebSocket(url); \
               ws.onopen = () => {{ window.tried[name] = 'open'; ws.close(); }}; \
               ws.onclose = (e) => {{ window.tried[name] ??= 'closed ' + e.code; }}; \
             }} \
             fetch('http://127.0.0.2:{port}/o/counter/c', {{ method: 'POST', mode: 'no-cors', body: '5' }}) \
               .then(() => window.tried.post = 'sent', () => window.tried.post = 'failed'); \
             true"
        ),
    );
    b.wait_for(
        &tab,
        "every attempt to end",
        "window.tried.own && window.tried.foreign && window.tried.post",
        WAIT,
    );
    let tried = b.eval(&tab, "window.tried");
    assert_eq!(tried["own"], "open", "{tried}");
    assert_eq!(tried["foreign"], "closed 1006", "{tried}");
    let stats = node.stats();
    assert_eq!(stats["origin_refused"], 2, "the upgrade and the POST");
    let read = request(
        node.public(),
        b"GET /o/counter/c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(read.json()["value"], 0, "the cross-site POST wrote nothing");
}

/// The chat page in Chromium: two tabs with two users' tokens (given in the fragment, then
/// kept out of the address bar) see each other in the room and each other's messages; a tab
/// without a token says so instead of connecting.
#[test]
fn two_users_chat_in_chromium() {
    let Some(bin) = find_chromium() else {
        support::skipped("no Chromium found (apt-get install chromium, or set COMBD_CHROMIUM)");
        return;
    };
    const SECRET: &str = "combd-browser-chat-secret-0123456789abcdef";
    let key = support::auth::key_file("browser-chat", SECRET);
    let node = TestNode::start(&[("COMBD_AUTH_JWT_KEY_FILE", key.to_str().unwrap())]);
    let token = |sub: &str, name: &str| support::auth::token(SECRET, sub, Some(name));
    let base = format!("http://127.0.0.2:{}/chat/?room=browser", node.port);
    let mut b = Browser::launch(&bin);
    let alice = b.open(&format!("{base}#token={}", token("alice", "Alice")));
    b.wait_for(&alice, "alice live", "chat.state === 'live'", WAIT);
    assert_eq!(
        b.eval(&alice, "location.hash"),
        "",
        "the token left the address bar"
    );
    let bob = b.open(&format!("{base}#token={}", token("bob", "Bob")));
    b.wait_for(&bob, "bob live", "chat.state === 'live'", WAIT);
    b.wait_for(
        &alice,
        "bob in alice's room",
        "chat.people.has('bob')",
        WAIT,
    );
    b.eval(
        &alice,
        "document.getElementById('text').value = 'hello from alice'; \
         document.getElementById('say').requestSubmit(); true",
    );
    b.wait_for(
        &bob,
        "alice's message in bob's tab",
        "[...document.querySelectorAll('#log li')].some(li => li.textContent.includes('Alicehello from alice'))",
        WAIT,
    );
    assert_eq!(b.eval(&bob, "chat.seen"), json!([1]));
    let nobody = b.open(&base);
    b.wait_for(
        &nobody,
        "the no-token state",
        "chat.state === 'unauthorized'",
        WAIT,
    );
}
