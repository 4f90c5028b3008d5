//! The fuzz targets' seed corpora (and anything the fuzzer found and was committed), run as
//! plain tests so CI exercises every input format's entry point.

use std::path::Path;

fn run(target: &str, f: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        f(&data);
        n += 1;
    }
    assert!(n > 0, "the {target} corpus is empty");
}

#[test]
fn http_head_corpus() {
    run("http_head", combd_testkit::fuzz::http_head);
}

#[test]
fn ws_frames_corpus() {
    run("ws_frames", combd_testkit::fuzz::ws_frames);
}

#[test]
fn settings_text_corpus() {
    run("settings_text", combd_testkit::fuzz::settings_text);
}

#[test]
fn proc_files_corpus() {
    run("proc_files", combd_testkit::fuzz::proc_files);
}

#[test]
fn object_name_corpus() {
    run("object_name", combd_testkit::fuzz::object_name);
}

#[test]
fn million_messages_corpus() {
    run("million_messages", combd::apps::million::fuzz_entry);
}
