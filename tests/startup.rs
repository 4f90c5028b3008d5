//! Start-up refusals against the real binary: a second node on a port or a data directory
//! already served, a data directory that cannot be written. Each refusal is exit 78 and one
//! line naming the setting.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};

use support::*;

fn tmpdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("combd-startup-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A certificate and its key (and a key of another pair) in `dir`, for the TLS settings.
fn tls_files(dir: &Path) -> [(&'static str, String); 3] {
    std::fs::create_dir_all(dir).unwrap();
    let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key, wrong) = (
        dir.join("cert.pem"),
        dir.join("key.pem"),
        dir.join("other-key.pem"),
    );
    std::fs::write(&cert, pair.cert.pem()).unwrap();
    std::fs::write(&key, pair.key_pair.serialize_pem()).unwrap();
    std::fs::write(&wrong, other.key_pair.serialize_pem()).unwrap();
    let s = |p: PathBuf| p.to_str().unwrap().to_string();
    [("cert", s(cert)), ("key", s(key)), ("other-key", s(wrong))]
}

#[test]
fn a_second_node_on_a_served_port_or_data_directory_is_refused() {
    let first = TestNode::start(&[]);
    let port = first.port.to_string();
    let other_data = tmpdir("second");

    // The same address and port: SO_REUSEPORT would let it in and split the connections.
    let same = format!("127.0.0.2:{port}");
    let err = refused(&mut combd_command(&other_data, &[("COMBD_LISTEN", &same)]));
    assert!(err.starts_with("combd: COMBD_LISTEN: "), "{err}");
    assert!(
        err.contains(&format!("port {port} is already served")),
        "{err}"
    );
    // Another address on the port: the localhost listener 127.0.0.1:port would be shared.
    let other = format!("127.0.0.3:{port}");
    let err = refused(&mut combd_command(&other_data, &[("COMBD_LISTEN", &other)]));
    assert!(err.contains(&format!("COMBD_LISTEN: port {port}")), "{err}");

    // The same data directory on another port.
    let err = refused(&mut combd_command(&first.data_dir, &[]));
    assert!(err.starts_with("combd: COMBD_DATA: "), "{err}");
    assert!(
        err.contains(&format!(
            "{} is in use by another combd (pid {})",
            first.data_dir.display(),
            first.pid()
        )),
        "{err}"
    );

    // The first node kept its port and data to itself, and serves.
    for _ in 0..8 {
        let r = request(first.public(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.status, 200);
    }
    assert_eq!(first.stats()["pid"], first.pid());
    let _ = std::fs::remove_dir_all(&other_data);

    // Its death frees both (the kernel drops the locks): a restart on them starts.
    let data = first.kill9();
    let again = TestNode::start_in(data, &[("COMBD_LISTEN", &same)]);
    assert_eq!(again.port.to_string(), port);
}

#[test]
fn a_second_node_on_a_served_tls_port_is_refused() {
    let dir = tmpdir("tls-port");
    let [(_, cert), (_, key), _] = tls_files(&dir);
    let tls = [
        ("COMBD_TLS_LISTEN", "127.0.0.2:0"),
        ("COMBD_TLS_CERT", cert.as_str()),
        ("COMBD_TLS_KEY", key.as_str()),
    ];
    let first = TestNode::start(&tls);
    let taken = format!("127.0.0.2:{}", first.tls_port.unwrap());
    let err = refused(&mut combd_command(
        &dir.join("data"),
        &[
            ("COMBD_TLS_LISTEN", taken.as_str()),
            ("COMBD_TLS_CERT", cert.as_str()),
            ("COMBD_TLS_KEY", key.as_str()),
        ],
    ));
    assert!(err.starts_with("combd: COMBD_TLS_LISTEN: port "), "{err}");
    assert_eq!(
        request(first.local(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status,
        200
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_data_path_that_is_a_file_is_not_a_directory() {
    let dir = tmpdir("file");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("data");
    std::fs::write(&file, b"not a directory").unwrap();
    let err = refused(&mut combd_command(&file, &[]));
    assert_eq!(
        err.trim(),
        format!("combd: COMBD_DATA: {} is not a directory", file.display())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unwritable_data_directory_is_refused() {
    // Root writes through any mode bits; a read-only filesystem stops it too.
    let Some(disk) = SmallDisk::mount("1m") else {
        return;
    };
    let data = disk.data_dir();
    std::fs::create_dir_all(data.join("objects")).unwrap();
    let fresh = disk.0.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    disk.remount_read_only();

    // Its objects directory exists but takes no file.
    let err = refused(&mut combd_command(&data, &[]));
    assert!(
        err.starts_with(&format!(
            "combd: COMBD_DATA: cannot write in {}",
            data.join("objects").display()
        )),
        "{err}"
    );
    assert!(err.contains("Read-only file system"), "{err}");
    // A directory whose objects directory cannot be created.
    let err = refused(&mut combd_command(&fresh, &[]));
    assert!(
        err.starts_with(&format!(
            "combd: COMBD_DATA: cannot create {}",
            fresh.join("objects").display()
        )),
        "{err}"
    );
    // --check-config runs the same check.
    let err = refused(combd_command(&data, &[]).arg("--check-config"));
    assert!(
        err.starts_with("combd: COMBD_DATA: cannot write in"),
        "{err}"
    );
}
