//! permessage-deflate (RFC 7692) on real sockets: the node's negotiation, what it decompresses
//! and refuses, and what it sends compressed, against a client that compresses and
//! decompresses with flate2 (raw deflate, a sync flush's four last bytes left out, as 7.2.1
//! says), frame by frame on a raw socket, so every bit on the wire is the test's to check.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use support::*;

/// The 101's extension header when the node accepts.
const ACCEPTED: &str =
    "sec-websocket-extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// Upgrades `s` at `path` offering `extensions` (none: no header); returns the 101's head.
fn upgrade(s: &mut TcpStream, path: &str, extensions: Option<&str>) -> String {
    let ext = extensions.map_or(String::new(), |e| {
        format!("Sec-WebSocket-Extensions: {e}\r\n")
    });
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{ext}\r\n"
    )
    .unwrap();
    let head = String::from_utf8(read_head(s)).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    head.to_ascii_lowercase()
}

/// A final, masked client frame; `rsv1`: compressed.
fn client_frame(opcode: u8, rsv1: bool, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let rsv1 = if rsv1 { 0x40 } else { 0 };
    combd_shards::ws::encode_masked_frame(&mut out, 0x80 | rsv1 | opcode, payload);
    out
}

/// The next server frame: its first byte (FIN, RSV bits, opcode) and payload.
fn next_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut h = [0u8; 2];
    s.read_exact(&mut h).expect("a frame");
    assert_eq!(h[1] & 0x80, 0, "server frames are not masked");
    let len = match h[1] & 0x7f {
        126 => {
            let mut l = [0u8; 2];
            s.read_exact(&mut l).unwrap();
            u16::from_be_bytes(l) as usize
        }
        127 => {
            let mut l = [0u8; 8];
            s.read_exact(&mut l).unwrap();
            u64::from_be_bytes(l) as usize
        }
        n => n as usize,
    };
    let mut p = vec![0; len];
    s.read_exact(&mut p).unwrap();
    (h[0], p)
}

/// A message's payload compressed as a permessage-deflate sender does.
fn compress(data: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(data.len() + 64);
    c.compress_vec(data, &mut out, FlushCompress::Sync).unwrap();
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]) && out.len() < out.capacity());
    out.truncate(out.len() - 4);
    out
}

/// A compressed message's payload decompressed as a permessage-deflate receiver does.
fn decompress(data: &[u8]) -> Vec<u8> {
    let mut d = Decompress::new(false);
    let mut input = data.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut out = Vec::with_capacity(1 << 20);
    d.decompress_vec(&input, &mut out, FlushDecompress::Sync)
        .unwrap();
    assert_eq!(d.total_in() as usize, input.len());
    out
}

/// A close frame's code.
fn close_code(s: &mut TcpStream) -> u16 {
    loop {
        let (b0, p) = next_frame(s);
        if b0 & 0x0f == 8 {
            return u16::from_be_bytes([p[0], p[1]]);
        }
    }
}

fn counter(stats: &serde_json::Value, name: &str) -> u64 {
    stats[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in /stats"))
}

#[test]
fn echo_negotiates_and_compresses_both_ways() {
    let node = TestNode::start(&[]);
    let mut s = connect(node.public());
    // As Chrome and Firefox offer it.
    let head = upgrade(
        &mut s,
        "/o/echo/z",
        Some("permessage-deflate; client_max_window_bits"),
    );
    assert!(head.contains(ACCEPTED), "{head}");
    let big = format!("{{\"text\":\"{}\"}}", "all work and no play ".repeat(40));
    // Compressed in, compressed out (FIN, RSV1, text).
    s.write_all(&client_frame(1, true, &compress(big.as_bytes())))
        .unwrap();
    let (b0, p) = next_frame(&mut s);
    assert_eq!(b0, 0xc1);
    assert!(p.len() < big.len() / 4, "{} bytes", p.len());
    assert_eq!(decompress(&p), big.as_bytes());
    // Compressed in, plain out: too short to be worth compressing.
    s.write_all(&client_frame(1, true, &compress(b"hi")))
        .unwrap();
    assert_eq!(next_frame(&mut s), (0x81, b"hi".to_vec()));
    // Plain in (compression is per message), compressed out; binary too.
    let bytes = vec![42u8; 5000];
    s.write_all(&client_frame(2, false, &bytes)).unwrap();
    let (b0, p) = next_frame(&mut s);
    assert_eq!(b0, 0xc2);
    assert_eq!(decompress(&p), bytes);
    // The empty message compressed (RFC 7692, 7.2.3.6).
    s.write_all(&client_frame(1, true, &[0x00])).unwrap();
    assert_eq!(next_frame(&mut s), (0x81, Vec::new()));
    let stats = node.stats();
    assert_eq!(counter(&stats, "ws_deflate_opened"), 1);
    assert_eq!(counter(&stats, "ws_inflated_in"), 3);
    assert_eq!(counter(&stats, "ws_deflated_out"), 2);
}

#[test]
fn offers_the_node_cannot_take_and_the_switch_off_give_plain_websockets() {
    let node = TestNode::start(&[]);
    // An offer with a parameter RFC 7692 does not define, then no offer at all: no extension,
    // and a compressed frame is then a protocol error.
    for offer in [Some("permessage-deflate; mystery=1"), None] {
        let mut s = connect(node.public());
        let head = upgrade(&mut s, "/o/echo/z", offer);
        assert!(!head.contains("sec-websocket-extensions"), "{head}");
        s.write_all(&client_frame(1, true, &compress(b"hello")))
            .unwrap();
        assert_eq!(close_code(&mut s), 1002);
    }
    // A declined offer, then one it takes: the second.
    let mut s = connect(node.public());
    let head = upgrade(
        &mut s,
        "/o/echo/z",
        Some("permessage-deflate; server_no_context_takeover=1, permessage-deflate"),
    );
    assert!(head.contains(ACCEPTED), "{head}");
    assert!(!head.contains("server_max_window_bits"), "{head}");
    // The node's own window (15 bits) asked for: named in the answer; long messages go
    // compressed.
    let mut s = connect(node.public());
    let head = upgrade(
        &mut s,
        "/o/echo/z",
        Some("permessage-deflate; server_max_window_bits=15"),
    );
    assert!(
        head.contains(&format!("{ACCEPTED}; server_max_window_bits=15")),
        "{head}"
    );
    let text = "z".repeat(100_000);
    s.write_all(&client_frame(1, false, text.as_bytes()))
        .unwrap();
    let (b0, p) = next_frame(&mut s);
    assert_eq!(b0, 0xc1);
    assert_eq!(decompress(&p), text.as_bytes());

    let off = TestNode::start(&[("COMBD_WS_DEFLATE", "off")]);
    let mut s = connect(off.public());
    let head = upgrade(&mut s, "/o/echo/z", Some("permessage-deflate"));
    assert!(!head.contains("sec-websocket-extensions"), "{head}");
    s.write_all(&client_frame(1, false, b"plain")).unwrap();
    assert_eq!(next_frame(&mut s), (0x81, b"plain".to_vec()));
    assert_eq!(counter(&off.stats(), "ws_deflate_opened"), 0);
}

#[test]
fn a_compression_bomb_closes_with_1009_and_garbage_with_1007() {
    let node = TestNode::start(&[]);
    let limit = node.stats()["limits"]["ws_max_message_bytes"]
        .as_u64()
        .unwrap();
    // 16 MiB of zeros compress to about 16 KiB: under the limit on the wire, far over it once
    // decompressed. The node stops at the limit, or sooner at 64 times the wire size
    // (`ws_inflate_ratio_max`): a 1009 either way.
    let bomb = compress(&vec![0u8; 16 << 20]);
    assert!((bomb.len() as u64) < limit / 8, "{}", bomb.len());
    let rss_before = rss(node.pid());
    let mut s = connect(node.public());
    upgrade(&mut s, "/o/echo/z", Some("permessage-deflate"));
    s.write_all(&client_frame(2, true, &bomb)).unwrap();
    assert_eq!(close_code(&mut s), 1009);
    assert!(
        rss(node.pid()) < rss_before + 16 * limit,
        "the node held what it decompressed"
    );
    // Bytes that are not deflate data, and text that is not UTF-8 once decompressed.
    for payload in [vec![0xffu8; 16], compress(&[b'a', 0xc3, 0x28])] {
        let mut s = connect(node.public());
        upgrade(&mut s, "/o/echo/z", Some("permessage-deflate"));
        s.write_all(&client_frame(1, true, &payload)).unwrap();
        assert_eq!(close_code(&mut s), 1007);
    }
    let stats = node.stats();
    assert_eq!(
        counter(&stats, "ws_protocol_closed") + counter(&stats, "ws_inflate_ratio_closed"),
        3
    );
}

#[test]
fn a_broadcast_goes_compressed_to_viewers_that_asked_and_plain_to_the_rest() {
    let node = TestNode::start(&[TEST_APPS]);
    let mut viewers: Vec<(TcpStream, bool)> = (0..4)
        .map(|i| {
            let deflate = i % 2 == 0;
            let mut s = connect(node.public());
            let head = upgrade(
                &mut s,
                "/o/fanout/d",
                deflate.then_some("permessage-deflate"),
            );
            assert_eq!(head.contains(ACCEPTED), deflate);
            (s, deflate)
        })
        .collect();
    // The sessions are attached once the upgrade is answered: 3 frames of 2,000 bytes.
    let r = post(&node, "/o/fanout/d?n=3&size=2000", "");
    assert_eq!(r.status, 200, "{}", r.text());
    let mut seen = Vec::new();
    for (s, deflate) in &mut viewers {
        let frames: Vec<Vec<u8>> = (0..3)
            .map(|_| {
                let (b0, p) = next_frame(s);
                if *deflate {
                    assert_eq!(b0, 0xc1);
                    assert!(p.len() < 200, "{} bytes", p.len());
                    decompress(&p)
                } else {
                    assert_eq!(b0, 0x81);
                    p
                }
            })
            .collect();
        seen.push(frames);
    }
    assert!(
        seen.iter().all(|f| f == &seen[0]),
        "every viewer got the same messages"
    );
    assert_eq!(seen[0][0].len(), 2000);
    // Each frame compressed for the two viewers that asked: counted per session it went to.
    assert_eq!(counter(&node.stats(), "ws_deflated_out"), 6);
}

#[test]
fn a_window_under_15_bits_is_passed_over() {
    let node = TestNode::start(&[]);
    // Alone: no compression at all, so a compressed frame is a protocol error.
    let mut s = connect(node.public());
    let head = upgrade(
        &mut s,
        "/o/echo/z",
        Some("permessage-deflate; server_max_window_bits=8"),
    );
    assert!(!head.contains("sec-websocket-extensions"), "{head}");
    let text = "y".repeat(5000);
    s.write_all(&client_frame(1, false, text.as_bytes()))
        .unwrap();
    assert_eq!(next_frame(&mut s), (0x81, text.clone().into_bytes()));
    s.write_all(&client_frame(1, true, &compress(b"hello")))
        .unwrap();
    assert_eq!(close_code(&mut s), 1002);
    // Before an acceptable offer: the next one is taken, and a message longer than 256 bytes
    // goes compressed.
    let mut s = connect(node.public());
    let head = upgrade(
        &mut s,
        "/o/echo/z",
        Some("permessage-deflate; server_max_window_bits=8, permessage-deflate"),
    );
    assert!(head.contains(ACCEPTED), "{head}");
    assert!(!head.contains("server_max_window_bits"), "{head}");
    s.write_all(&client_frame(1, false, text.as_bytes()))
        .unwrap();
    let (b0, p) = next_frame(&mut s);
    assert_eq!(b0, 0xc1);
    assert_eq!(decompress(&p), text.as_bytes());
    assert_eq!(counter(&node.stats(), "ws_deflate_opened"), 1);
}

/// A socket whose receive buffer is held small, so what the node writes to it waits in the
/// node once a few kilobytes are in flight.
fn connect_not_reading(node: &TestNode) -> TcpStream {
    let s = connect(node.public());
    socket2::SockRef::from(&s)
        .set_recv_buffer_size(4096)
        .unwrap();
    s
}

#[test]
fn deflate_bombs_close_with_1009_before_they_cost_anything() {
    let node = TestNode::start(&[]);
    let limits = node.stats()["limits"].clone();
    let ratio = limits["ws_inflate_ratio_max"].as_u64().unwrap();
    let max = limits["ws_max_message_bytes"].as_u64().unwrap();
    // About 1 KiB on the wire, a megabyte once decompressed: a thousand times.
    let bomb = compress(&vec![0u8; max as usize - 64]);
    assert!((bomb.len() as u64) * ratio < max / 8, "{}", bomb.len());
    let frame = client_frame(2, true, &bomb);
    let rss_before = rss(node.pid());
    // Ten sockets, each sending 62 bombs in one write and never reading.
    let mut socks: Vec<TcpStream> = (0..10)
        .map(|_| {
            let mut s = connect_not_reading(&node);
            let head = upgrade(&mut s, "/o/echo/z", Some("permessage-deflate"));
            assert!(head.contains(ACCEPTED), "{head}");
            s.write_all(&frame.repeat(62)).unwrap();
            s
        })
        .collect();
    let stats = wait_stats(&node, "ten bombs refused", |s| {
        s["ws_inflate_ratio_closed"].as_u64() == Some(10)
    });
    // Each closed at its first bomb, within 64 times its size: nothing echoed, nothing held.
    assert_eq!(counter(&stats, "ws_messages_in"), 0);
    assert!(
        counter(&stats, "outbound_bytes_max") < 10 * 1024,
        "{}",
        stats["outbound_bytes_max"]
    );
    assert!(
        rss(node.pid()) < rss_before + (16 << 20),
        "the node held the bombs"
    );
    assert_eq!(close_code(&mut socks[0]), 1009);
    socks.clear();
    assert_eq!(counter(&node.stats(), "ws_protocol_closed"), 0);
}

#[test]
fn compressed_bytes_a_second_are_a_rate_closed_with_1008() {
    // 64 KiB a second of decompressed bytes, and messages of at most 64 KiB: a bucket of
    // 64 KiB, which one message of 40 KiB leaves too little of for a second one at once.
    let node = TestNode::start(&[
        ("COMBD_WS_INFLATE_RATE", "64K"),
        ("COMBD_WS_MAX_MESSAGE", "64K"),
    ]);
    assert_eq!(
        node.stats()["limits"]["ws_inflate_rate_bytes"].as_u64(),
        Some(64 * 1024)
    );
    // Numbers as JSON: a few times smaller compressed, far within the ratio.
    let numbers: String = (0..10_000)
        .map(|i| format!("{},", i * 7919 % 100_003))
        .collect();
    let message = format!("[{}]", &numbers[..40_000]);
    let frame = client_frame(1, true, &compress(message.as_bytes()));
    assert!(frame.len() * 64 > message.len(), "{} bytes", frame.len());
    let mut s = connect(node.public());
    upgrade(&mut s, "/o/echo/z", Some("permessage-deflate"));
    s.write_all(&frame.repeat(2)).unwrap();
    let (b0, p) = next_frame(&mut s);
    assert_eq!(b0, 0xc1);
    assert_eq!(decompress(&p), message.as_bytes());
    assert_eq!(close_code(&mut s), 1008);
    let stats = node.stats();
    assert_eq!(counter(&stats, "ws_inflate_rate_closed"), 1);
    assert_eq!(counter(&stats, "ws_inflated_in"), 1);
    // Plain messages are not counted against it: a plain WebSocket sends as many.
    let mut s = connect(node.public());
    upgrade(&mut s, "/o/echo/z", None);
    s.write_all(&client_frame(1, false, message.as_bytes()).repeat(4))
        .unwrap();
    for _ in 0..4 {
        assert_eq!(next_frame(&mut s), (0x81, message.clone().into_bytes()));
    }
}

#[test]
fn a_read_of_compressed_messages_yields_between_them() {
    let node = TestNode::start(&[]);
    let per_turn = node.stats()["limits"]["ws_decode_bytes_per_turn"]
        .as_u64()
        .unwrap() as usize;
    // Eight messages of a turn's bytes each once decompressed, in one write (a read holds
    // several): the connection hands one on, then yields, and so on.
    let numbers: String = (0..20_000)
        .map(|i| format!("{},", i * 7919 % 100_003))
        .collect();
    let message = format!("[{}]", &numbers[..per_turn]);
    let frame = client_frame(1, true, &compress(message.as_bytes()));
    let yields = counter(&node.stats(), "turn_yields");
    let mut s = connect(node.public());
    upgrade(&mut s, "/o/echo/z", Some("permessage-deflate"));
    s.write_all(&frame.repeat(8)).unwrap();
    for _ in 0..8 {
        let (b0, p) = next_frame(&mut s);
        assert_eq!(b0, 0xc1);
        assert_eq!(decompress(&p), message.as_bytes());
    }
    assert!(counter(&node.stats(), "turn_yields") > yields);
}

#[test]
fn answers_waiting_for_a_socket_that_does_not_read_are_counted_and_bounded() {
    // A shard's outbound budget of 1.5 MiB, on one shard: room for the answer of one socket
    // that does not read, not for a second beside it.
    let node = TestNode::start(&[("COMBD_SHARDS", "1"), ("COMBD_OUTBOUND_BUDGET", "1536K")]);
    let limits = node.stats()["limits"].clone();
    let per_turn = limits["ws_decode_bytes_per_turn"].as_u64().unwrap();
    let rss_before = rss(node.pid());
    // The attack of a window under 15 bits, after it is declined: plain messages of a
    // megabyte, echoed plain, never read.
    let message = vec![b'a'; (1 << 20) - 64];
    let frame = client_frame(2, false, &message);
    let socks: Vec<(TcpStream, std::thread::JoinHandle<()>)> = (0..3)
        .map(|_| {
            let mut s = connect_not_reading(&node);
            let head = upgrade(
                &mut s,
                "/o/echo/z",
                Some("permessage-deflate; server_max_window_bits=8"),
            );
            assert!(!head.contains("sec-websocket-extensions"), "{head}");
            let mut w = s.try_clone().unwrap();
            let frames = frame.repeat(8);
            // Blocks once the node stops reading it; ends when the socket is shut down.
            let writer = std::thread::spawn(move || {
                let _ = w.write_all(&frames);
            });
            (s, writer)
        })
        .collect();
    // One socket's echo waits in the node, counted; the others' do not fit beside it.
    let stats = wait_stats(&node, "an echo held and two closed at the budget", |s| {
        s["outbound_bytes"].as_u64() >= Some(message.len() as u64)
            && s["outbound_budget_closed"].as_u64() == Some(2)
    });
    let held = counter(&stats, "outbound_bytes_max");
    assert!(
        held <= 1536 << 10 && held <= message.len() as u64 + per_turn + 64,
        "{held} bytes held"
    );
    assert!(
        rss(node.pid()) < rss_before + (32 << 20),
        "the node held the echoes"
    );
    for (s, writer) in socks {
        let _ = s.shutdown(std::net::Shutdown::Both);
        writer.join().unwrap();
    }
    wait_stats(&node, "the held echo let go", |s| {
        s["outbound_bytes"].as_u64() == Some(0) && s["ws_open"].as_u64() == Some(0)
    });
}
