//! Scripts of clients against a real node (`COMBD_BIN`, a `combd-test-node`, started once): see
//! `combd_testkit::fuzz::conn`. The node runs in its own process, so libFuzzer's coverage is the
//! harness's (the script's shape), not the node's; each input is a real run on loopback.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| combd_testkit::fuzz::conn::http_conn(data));
