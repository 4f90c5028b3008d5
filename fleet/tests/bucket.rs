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
