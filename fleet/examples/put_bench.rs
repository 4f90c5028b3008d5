//! How a bucket answers one object's segment uploads one at a time and several at once: for
//! each number of threads given, every thread PUTs 4 KiB bodies under its own keys for SECS
//! seconds; prints PUTs a second and the latencies' p50, p99 and max. What the node's upload
//! threads meet, without the node (the fleet's pipelined uploads send up to 8 at once).
//!
//!     COMBD_FLEET_TEST_S3=endpoint,bucket,region,access_key,secret_key \
//!         cargo run --release -p combd-fleet --example put_bench [SECS] [THREADS...]
//!
//! (`tools/fleet-env/up DIR` writes that variable into DIR/env.) Defaults: 5 s, threads 1 and 8.

#![allow(clippy::unwrap_used)]

#[path = "support/test_s3.rs"]
mod test_s3;

use std::time::{Duration, Instant};

/// Bytes of each PUT: a small segment (one batch of a few counter increments).
const BODY: usize = 4 * 1024;

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args
        .next()
        .map_or(5, |a| a.parse().expect("SECS is a number"));
    let mut threads: Vec<usize> = args
        .map(|a| a.parse().expect("THREADS are numbers"))
        .collect();
    if threads.is_empty() {
        threads = vec![1, 8];
    }
    let bucket = test_s3::bucket();
    let body = vec![7u8; BODY];
    for n in threads {
        let until = Instant::now() + Duration::from_secs(secs);
        let mut times: Vec<Duration> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|t| {
                    let (bucket, body) = (&bucket, &body);
                    s.spawn(move || {
                        let mut times = Vec::new();
                        let mut i = 0u64;
                        while Instant::now() < until {
                            let key = format!("put-bench-{}/{t}/{i:08}", std::process::id());
                            let t0 = Instant::now();
                            bucket.put(&key, body).unwrap();
                            times.push(t0.elapsed());
                            i += 1;
                        }
                        times
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        times.sort();
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
        println!(
            "threads {n}: {} PUTs in {secs} s = {}/s; ms p50 {:.1} p99 {:.1} max {:.1}",
            times.len(),
            times.len() as u64 / secs,
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
}
