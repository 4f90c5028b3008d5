//! Modules calling the node's imports in any order with any arguments, deployed on a real
//! node (`COMBD_BIN`, started once) and driven by real clients: see
//! `combd_testkit::fuzz::host`. The node runs in its own process, so libFuzzer's coverage is
//! the harness's (the script's shape), not the node's; each input is a real run on loopback.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| combd_testkit::fuzz::host::host_imports(data));
