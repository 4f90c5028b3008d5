//! The S3 client against a real S3 server: Garage, started by each test on loopback (or the
//! server `COMBD_FLEET_TEST_S3` names, see `support::S3`).

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use combd_fleet::bucket::{Bucket, BucketConfig};
use combd_fleet::Failure;
use support::S3;

#[test]
fn put_get_list_delete_round_trip() {
    let Some(s3) = S3::start("put_get_list_delete_round_trip") else {
        return;
    };
    let bucket = Bucket::new(&s3.bucket).unwrap();
    let prefix = s3.unique_prefix();
    let key = |name: &str| format!("{prefix}{name}");
    assert_eq!(
        bucket.get(&key("a"), 1 << 20).unwrap(),
        None,
        "nothing there yet"
    );
    assert_eq!(bucket.list(&prefix, 10).unwrap(), Vec::<String>::new());

    let body: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    bucket.put(&key("a"), &body).unwrap();
    bucket.put(&key("b/1"), b"one").unwrap();
    bucket.put(&key("b/2"), b"").unwrap();
    assert_eq!(
        bucket.get(&key("a"), 1 << 20).unwrap().as_deref(),
        Some(&body[..])
    );
    assert_eq!(
        bucket.get(&key("b/2"), 1 << 20).unwrap().as_deref(),
        Some(&b""[..])
    );
    // A put replaces.
    bucket.put(&key("b/1"), b"uno").unwrap();
    assert_eq!(
        bucket.get(&key("b/1"), 10).unwrap().as_deref(),
        Some(&b"uno"[..])
    );
    assert_eq!(
        bucket.list(&prefix, 10).unwrap(),
        [key("a"), key("b/1"), key("b/2")]
    );
    assert_eq!(
        bucket.list(&key("b/"), 10).unwrap(),
        [key("b/1"), key("b/2")]
    );

    bucket.delete(&key("a")).unwrap();
    assert_eq!(bucket.get(&key("a"), 1 << 20).unwrap(), None);
    // Deleting what is not there succeeds, as S3 says.
    bucket.delete(&key("a")).unwrap();
    assert_eq!(bucket.list(&prefix, 10).unwrap(), [key("b/1"), key("b/2")]);
}

#[test]
fn reads_are_bounded_and_listings_are_not_cut_silently() {
    let Some(s3) = S3::start("reads_are_bounded_and_listings_are_not_cut_silently") else {
        return;
    };
    let bucket = Bucket::new(&s3.bucket).unwrap();
    let prefix = s3.unique_prefix();
    let key = format!("{prefix}obj");
    bucket.put(&key, &[7u8; 1000]).unwrap();
    // max - 1, max, max + 1 around the object's size.
    let e = bucket.get(&key, 999).unwrap_err();
    assert!(matches!(e.failure, Failure::TooLarge { limit: 999 }), "{e}");
    assert_eq!(e.op, "get");
    assert_eq!(bucket.get(&key, 1000).unwrap().unwrap().len(), 1000);
    assert_eq!(bucket.get(&key, 1001).unwrap().unwrap().len(), 1000);

    bucket.put(&format!("{prefix}obj2"), b"x").unwrap();
    bucket.put(&format!("{prefix}obj3"), b"x").unwrap();
    assert_eq!(bucket.list(&prefix, 3).unwrap().len(), 3);
    let e = bucket.list(&prefix, 2).unwrap_err();
    assert!(matches!(e.failure, Failure::TooLarge { limit: 2 }), "{e}");
}

#[test]
fn a_wrong_secret_is_refused_with_the_servers_word() {
    let Some(s3) = S3::start("a_wrong_secret_is_refused_with_the_servers_word") else {
        return;
    };
    let wrong = BucketConfig {
        secret_key: "0".repeat(64),
        ..s3.bucket.clone()
    };
    let bucket = Bucket::new(&wrong).unwrap();
    let key = format!("{}x", s3.unique_prefix());
    let e = bucket.put(&key, b"x").unwrap_err();
    match &e.failure {
        Failure::Status { code, body } => {
            assert_eq!(*code, 403, "{e}");
            assert!(!body.is_empty(), "the server's error is kept: {e}");
        }
        other => panic!("expected a 403, got {other:?}"),
    }
    assert!(e.to_string().contains(&key), "the error names the key: {e}");
    // Nothing was written.
    assert_eq!(
        Bucket::new(&s3.bucket).unwrap().get(&key, 10).unwrap(),
        None
    );
}

#[test]
fn an_unreachable_bucket_fails_fast_naming_the_call() {
    let port = support::free_port();
    let bucket = Bucket::new(&BucketConfig {
        endpoint: format!("http://127.0.0.1:{port}"),
        bucket: "combd-test".into(),
        region: "garage".into(),
        access_key: "GK".into(),
        secret_key: "s".into(),
    })
    .unwrap();
    let started = Instant::now();
    let e = bucket.put("room/seg/1", b"x").unwrap_err();
    assert!(matches!(e.failure, Failure::Unreachable(_)), "{e}");
    assert_eq!((e.op, e.key.as_str()), ("put", "room/seg/1"));
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// A proxy in front of the real bucket that answers the first `busy` requests itself with
/// `503 ServiceUnavailable` (as Garage does when its metadata database is locked by concurrent
/// writes), each after reading the whole request, and passes the rest on. Its address, and how
/// many requests it answered itself.
fn busy_proxy(
    to: std::net::SocketAddr,
    busy: usize,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::atomic::Ordering::SeqCst;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = refused.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            if count.load(SeqCst) < busy {
                // Read the request whole, then answer 503 and close.
                let mut reader = BufReader::new(client.try_clone().unwrap());
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                count.fetch_add(1, SeqCst);
                let xml = "<Error><Code>ServiceUnavailable</Code><Message>database is locked</Message></Error>";
                let _ = write!(
                    client,
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{xml}",
                    xml.len()
                );
                continue;
            }
            let Ok(server) = std::net::TcpStream::connect(to) else {
                continue;
            };
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let mut server = server;
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut server);
                let _ = server.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut client);
                let _ = client.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (addr, refused)
}

/// A bucket that answers 503 ("try again") gets the same call again, up to
/// `FLEET_BUCKET_RETRIES` times: three busy answers are ridden out, four fail the call with
/// the server's 503.
#[test]
fn a_busy_bucket_is_tried_again_up_to_the_retries() {
    use combd_kernel::limits::FLEET_BUCKET_RETRIES;
    use std::sync::atomic::Ordering::SeqCst;
    let Some(s3) = S3::start("a_busy_bucket_is_tried_again") else {
        return;
    };
    let to: std::net::SocketAddr = s3
        .bucket
        .endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let busy = FLEET_BUCKET_RETRIES as usize;
    let (addr, refused) = busy_proxy(to, busy);
    let through = Bucket::new(&BucketConfig {
        endpoint: format!("http://{addr}"),
        ..s3.bucket.clone()
    })
    .unwrap();
    let key = format!("{}seg", s3.unique_prefix());
    through.put(&key, b"shipped").unwrap();
    assert_eq!(refused.load(SeqCst), busy, "every busy answer was met");
    assert_eq!(through.retries(), busy as u64);
    assert_eq!(
        Bucket::new(&s3.bucket)
            .unwrap()
            .get(&key, 100)
            .unwrap()
            .as_deref(),
        Some(&b"shipped"[..])
    );

    // One busy answer more than the retries: the call fails with the server's 503.
    let (addr, refused) = busy_proxy(to, busy + 1);
    let through = Bucket::new(&BucketConfig {
        endpoint: format!("http://{addr}"),
        ..s3.bucket.clone()
    })
    .unwrap();
    let e = through.put(&format!("{key}2"), b"x").unwrap_err();
    assert!(
        matches!(e.failure, Failure::Status { code: 503, .. }),
        "{e}"
    );
    assert_eq!(refused.load(SeqCst), busy + 1);
    assert_eq!(
        Bucket::new(&s3.bucket)
            .unwrap()
            .get(&format!("{key}2"), 100)
            .unwrap(),
        None,
        "nothing stored"
    );
}

/// The process's peak resident memory so far (`VmHWM`), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[test]
fn a_sealed_file_goes_up_and_comes_down_streamed_and_checked() {
    let Some(s3) = S3::start("a_sealed_file_goes_up_and_comes_down_streamed") else {
        return;
    };
    let bucket = Bucket::new(&s3.bucket)
        .unwrap()
        .with_fleet_key(support::fleet_key());
    let key = format!("{}snapshot", s3.unique_prefix());
    let dir = support::temp_dir("streamed");
    // 64 MiB, of a pattern (so a misplaced piece shows) the size of a database worth holding.
    const LEN: usize = 64 << 20;
    let source = dir.join("up.sqlite");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&source).unwrap());
        let block: Vec<u8> = (0..1024 * 1024u32).map(|i| (i * 31 % 253) as u8).collect();
        for i in 0..(LEN >> 20) {
            f.write_all(&[i as u8]).unwrap();
            f.write_all(&block[1..]).unwrap();
        }
    }
    let before = peak_rss();
    assert_eq!(
        bucket.put_sealed_file(&key, &source, LEN as u64).unwrap(),
        LEN as u64
    );
    let out = dir.join("down.sqlite");
    assert_eq!(
        bucket.get_sealed_to_file(&key, &out, LEN as u64).unwrap(),
        Some(LEN as u64)
    );
    let grew = peak_rss().saturating_sub(before);
    assert!(
        grew < 16 << 20,
        "a 64 MiB round trip raised the peak by {grew} bytes: it was held whole"
    );
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&source).unwrap());
    // The same seal as the whole-body form, either way.
    let small = format!("{}small", s3.unique_prefix());
    bucket.put_sealed(&small, b"sealed whole".to_vec()).unwrap();
    let small_out = dir.join("small");
    assert_eq!(
        bucket.get_sealed_to_file(&small, &small_out, 100).unwrap(),
        Some(12)
    );
    assert_eq!(std::fs::read(&small_out).unwrap(), b"sealed whole");
    std::fs::write(&small_out, b"sent streamed").unwrap();
    bucket.put_sealed_file(&small, &small_out, 100).unwrap();
    assert_eq!(
        bucket.get_sealed(&small, 100).unwrap().unwrap(),
        b"sent streamed"
    );
    // Bounds: at the bound it passes (above), one byte under it fails, either way.
    let e = bucket
        .put_sealed_file(&key, &source, LEN as u64 - 1)
        .unwrap_err();
    assert!(matches!(e.failure, Failure::TooLarge { .. }), "{e}");
    let past = dir.join("past.sqlite");
    let e = bucket
        .get_sealed_to_file(&key, &past, LEN as u64 - 1)
        .unwrap_err();
    assert!(matches!(e.failure, Failure::TooLarge { .. }), "{e}");
    assert!(!past.exists());
    // A changed byte fails the check, and leaves no file behind.
    let mut stored = bucket.get(&small, 100).unwrap().unwrap();
    stored[3] ^= 1;
    bucket.put(&small, &stored).unwrap();
    let bad = dir.join("bad");
    let e = bucket.get_sealed_to_file(&small, &bad, 100).unwrap_err();
    assert_eq!(e.failure, Failure::NotSealed, "{e}");
    assert!(!bad.exists(), "nothing of what failed is left");
    // Nothing there: none, and no file.
    let none = dir.join("none");
    let missing = format!("{}missing", s3.unique_prefix());
    assert_eq!(
        bucket.get_sealed_to_file(&missing, &none, 100).unwrap(),
        None
    );
    assert!(!none.exists());
    let _ = std::fs::remove_dir_all(dir);
}
