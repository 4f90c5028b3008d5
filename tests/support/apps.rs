//! Apps directories of modules for a test, and a node refused at start-up by one.

use super::{combd_command, refused, Resp};

/// A fresh apps directory holding `modules`: (file name, text).
pub fn apps_dir(modules: &[(&str, &str)]) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "combd-apps-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in modules {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}
/// The stderr of a node refused at start-up with the apps directory holding `modules`, and
/// the directory.
pub fn refused_with(modules: &[(&str, &str)]) -> (String, std::path::PathBuf) {
    let dir = apps_dir(modules);
    let data = std::env::temp_dir().join(format!("combd-test-refused-{}", std::process::id()));
    let stderr = refused(&mut combd_command(
        &data,
        &[("COMBD_APPS_DIR", dir.to_str().unwrap())],
    ));
    (stderr, dir)
}

/// An error answer's status and message.
pub fn error(r: &Resp) -> (u16, String) {
    (
        r.status,
        r.json()["error"].as_str().unwrap_or("").to_string(),
    )
}

/// A module answering `{"v": <version>}` to every request.
pub fn versioned(v: u32) -> String {
    format!(
        r#"(module
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{{\"v\":{v}}}")
  (func (export "handle") (result i32)
    (call $respond (i32.const 200) (i32.const 0) (i32.const {len}))
    (i32.const 0)))"#,
        len = format!("{{\"v\":{v}}}").len()
    )
}
