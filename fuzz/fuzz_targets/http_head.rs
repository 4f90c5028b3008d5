#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    combd_testkit::fuzz::http_head(data);
});
