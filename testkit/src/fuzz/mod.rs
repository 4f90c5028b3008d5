//! Entry points for the fuzz targets (`fuzz/fuzz_targets/`), one per input format the node
//! parses from outside. Each must return for any input, never panic, and keep its invariants
//! (asserted here). `tests/fuzz_corpus.rs` runs every committed corpus file through them. The
//! million app's messages are the one format not here: its entry is the app's own
//! (`combd::apps::million::fuzz_entry`), as the app is `combd`'s and this crate does not use
//! `combd`.
//!
//! Two targets are not parsers but scripts played against a real node ([`node`]), and
//! `tests/<target>_fuzz.rs` replays each one's corpus and [`mutant`]s of it:
//! - `http_conn` ([`conn`]) plays a script of clients ([`script`]) and checks the node's byte
//!   bounds after each;
//! - `host_imports` ([`host`]) deploys a module calling the WebAssembly host imports in any
//!   order with any arguments ([`imports`], [`steps`], written by [`wat`]), plays its
//!   clients ([`clients`]), and checks the node stayed whole and its object alone was touched.

pub mod clients;
pub mod conn;
mod cursor;
pub mod host;
pub mod imports;
pub mod node;
pub mod script;
pub mod steps;
pub mod wat;

use std::collections::BTreeMap;
use std::path::Path;

use combd_kernel::{memory, settings};
use combd_shards::app::object_path;
use combd_shards::app::valid_object_name;
use combd_shards::http::{self, Parsed};
use combd_shards::ws::{Decoder, WsEvent};

/// HTTP request heads and body framing.
pub fn http_head(data: &[u8]) {
    if let Ok(Parsed::Complete(head)) = http::parse_head(data) {
        assert!(head.len <= data.len());
        assert!(head.len <= combd_kernel::limits::HEADER_SECTION_MAX_BYTES);
        let total = head.len.saturating_add(head.body_len as usize);
        if data.len() >= total {
            let mut headers = [httparse::EMPTY_HEADER; combd_kernel::limits::HEADER_COUNT_MAX];
            if let Some(req) = http::borrow_request(data, &head, &mut headers) {
                assert_eq!(req.body.len() as u64, head.body_len);
                assert!(req.path.len() <= combd_kernel::limits::URL_MAX_BYTES);
            }
        }
    }
}

/// WebSocket frames and message reassembly with a small limit, fed in uneven pieces as reads
/// would bring them. The first byte picks the piece size (its low six bits) and whether
/// permessage-deflate was negotiated (its seventh: compressed messages are decompressed within
/// the limit). The input is also read as a `Sec-WebSocket-Extensions` offer.
pub fn ws_frames(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let _ = combd_shards::ws::deflate::offered([rest]);
    let step = usize::from(first % 64) + 1;
    let max = 300u64;
    let mut decoder = Decoder::new(max).with_deflate(first & 64 != 0);
    let mut buf = Vec::new();
    for piece in rest.chunks(step) {
        buf.extend_from_slice(piece);
        let mut closed = false;
        match decoder.decode(&mut buf, |ev| {
            match ev {
                WsEvent::Text(t) => assert!(t.len() as u64 <= max),
                WsEvent::Binary(b) => assert!(b.len() as u64 <= max),
                WsEvent::Ping(p) => assert!(p.len() <= 125),
                WsEvent::Close(..) => closed = true,
                WsEvent::Pong => {}
            }
            !closed
        }) {
            Ok(used) => {
                assert!(used <= buf.len());
                buf.drain(..used);
            }
            Err(_) => return,
        }
        if closed {
            return;
        }
    }
}

/// Every setting parser: the input's lines are `NAME=value` environment entries, then the same
/// values as flags.
pub fn settings_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut env = BTreeMap::new();
    let mut args = Vec::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            env.insert(k.to_string(), v.to_string());
            if let Some(spec) = settings::SETTINGS.iter().find(|s| s.env == k) {
                args.push(spec.flag.to_string());
                args.push(v.to_string());
            }
        }
        let _ = settings::parse_bytes(line);
        let _ = settings::parse_duration(line);
        let _ = settings::parse_count(line);
        let _ = settings::parse_listen(line);
    }
    for a in [&[][..], &args[..]] {
        if let Ok((_, s)) = settings::Settings::load(|k| env.get(k).cloned(), a, 4) {
            // Zero never means unlimited.
            assert!(s.max_body_bytes > 0 && s.max_conns > 0 && s.max_awake > 0);
            assert!(!s.header_timeout.is_zero() && !s.shutdown_timeout.is_zero());
            assert!(s.shards >= 1 && s.shards <= 4);
        }
    }
}

/// The cgroup, mountinfo, meminfo, statm and sockstat parsers.
pub fn proc_files(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (cg, mi) = text.split_once("\n---\n").unwrap_or((text, text));
    for (_, dir) in memory::memory_cgroup_candidates(cg, mi) {
        // Candidates stay under a cgroup mount point found in mountinfo.
        assert!(memory::parse_mountinfo(mi)
            .iter()
            .any(|m| dir.starts_with(&m.mount_point)));
    }
    let _ = memory::parse_limit(text);
    let _ = memory::parse_bytes_file(text);
    let _ = memory::parse_memory_stat(text, "inactive_file");
    if let Ok(m) = memory::parse_meminfo(text) {
        let _ = combd_kernel::admission::pressure(1, 1, m.total_bytes, m.available_bytes);
    }
    let _ = memory::parse_statm(text, 4096);
    let _ = memory::parse_sockstat_tcp_pages(text);
}

/// Object names: a valid name is one path component inside the data directory.
pub fn object_name(data: &[u8]) {
    let Ok(name) = std::str::from_utf8(data) else {
        return;
    };
    if valid_object_name(name) {
        let data_dir = Path::new("/data");
        let p = object_path(data_dir, "app", name);
        assert!(p.starts_with("/data/objects/app/"));
        assert_eq!(p.components().count(), 5, "{p:?}");
        assert!(!name.contains('/') && name != ".." && name != ".");
    }
}

/// splitmix64: the random scripts' bytes, the same on every run.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seeds of a stable mutant run: `COMBD_FUZZ_SCRIPTS` of them (else `default`), from
/// `COMBD_FUZZ_FIRST_SEED` (else 0).
pub fn mutant_seeds(default: u64) -> std::ops::Range<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    let n = var("COMBD_FUZZ_SCRIPTS").unwrap_or(default);
    let first = var("COMBD_FUZZ_FIRST_SEED").unwrap_or(0);
    first..first + n
}

/// `seed`'s input: a corpus file mutated a few times (bytes changed, inserted, deleted, a
/// range repeated, another file spliced in), as a fuzzer would, the same on every run.
pub fn mutant(seed: u64, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut state = seed;
    let mut r = |n: usize| (next(&mut state) % n.max(1) as u64) as usize;
    let mut data = corpus[r(corpus.len())].clone();
    for _ in 0..1 + r(6) {
        let at = r(data.len() + 1);
        match r(5) {
            0 if at < data.len() => data[at] = r(256) as u8,
            1 => data.insert(at, r(256) as u8),
            2 if at < data.len() => {
                let end = (at + 1 + r(8)).min(data.len());
                data.drain(at..end);
            }
            3 if at < data.len() => {
                let end = (at + 1 + r(16)).min(data.len());
                let piece = data[at..end].to_vec();
                data.splice(at..at, piece);
            }
            _ => {
                let other = &corpus[r(corpus.len())];
                let from = r(other.len());
                data.splice(at..at, other[from..].iter().copied());
            }
        }
    }
    data
}
