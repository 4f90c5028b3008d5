//! The fleet's servers over TLS, as an operator runs them on a network that is not the fleet's
//! own: etcd over https, a client certificate required (`--client-cert-auth`) and RBAC on (the
//! node's user kept to the fleet's keys), and the bucket behind an https front. A node that
//! has the authority, its certificate and its password works as over plain HTTP; one short of
//! any of them does not start, and says which setting to look at.

use std::path::PathBuf;
use std::sync::Arc;

use super::support::tls::{Authority, Pair};
use super::support::tls_front::TlsFront;
use super::support::{combd_command, run_to_exit};
use super::{fleet_support, get, post_acked, until_200, value, Fleet, LEASE_TTL};

/// A ureq agent trusting `ca`, showing `client` when asked.
fn agent(ca: &Authority, client: &Pair) -> ureq::Agent {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
    let root = Certificate::from_pem(ca.pem.as_bytes()).unwrap();
    let cert = Certificate::from_pem(client.cert_pem.as_bytes()).unwrap();
    let key = PrivateKey::from_pem(client.key_pem.as_bytes()).unwrap();
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::Specific(Arc::new(vec![root])))
        .client_cert(Some(ClientCert::new_with_certs(&[cert], key)))
        .build();
    ureq::Agent::config_builder().tls_config(tls).build().into()
}

#[test]
fn a_node_reaches_etcd_and_the_bucket_over_tls_as_an_etcd_user_and_not_without_each_part() {
    let test = "a_node_reaches_etcd_and_the_bucket_over_tls";
    let dir = fleet_support::temp_dir("fleet-tls");
    let write = |name: &str, text: &str| -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let ca = Authority::new("combd test fleet authority");
    let (server, client) = (ca.server(), ca.client());
    let ca_file = write("ca.pem", &ca.pem);
    let (etcd_cert, etcd_key) = (
        write("etcd.pem", &server.cert_pem),
        write("etcd.key", &server.key_pem),
    );
    let (node_cert, node_key) = (
        write("node.pem", &client.cert_pem),
        write("node.key", &client.key_pem),
    );
    let password = write("etcd.password", "node-password\n");
    let wrong_password = write("etcd.wrong", "not-the-password\n");
    let admin = agent(&ca, &client);
    let show = |p: &PathBuf| p.display().to_string();
    let Some(etcd) = fleet_support::Etcd::start_with(
        test,
        "https",
        &[
            format!("--cert-file={}", show(&etcd_cert)),
            format!("--key-file={}", show(&etcd_key)),
            format!("--trusted-ca-file={}", show(&ca_file)),
            "--client-cert-auth".to_string(),
        ],
        &admin,
    ) else {
        return;
    };
    // The node's user may read and write the fleet's keys (combd/...) and nothing else.
    etcd.enable_auth(&admin, "combd-node", "node-password", "combd/");
    let Some(fleet) = Fleet::with_etcd(test, etcd) else {
        return;
    };
    let garage = fleet
        .s3
        .bucket
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let front = TlsFront::start(garage, &server);
    let bucket_url = format!("https://{}", front.addr);
    let (ca_s, cert_s, key_s, pw_s) = (
        show(&ca_file),
        show(&node_cert),
        show(&node_key),
        show(&password),
    );
    let tls: Vec<(&str, &str)> = vec![
        ("COMBD_FLEET_CA_FILE", &ca_s),
        ("COMBD_FLEET_ETCD_CERT_FILE", &cert_s),
        ("COMBD_FLEET_ETCD_KEY_FILE", &key_s),
        ("COMBD_FLEET_ETCD_USER", "combd-node"),
        ("COMBD_FLEET_ETCD_PASSWORD_FILE", &pw_s),
    ];

    // All of it: the writes are acknowledged (claimed and shipped through both), and a node
    // started after the first is killed restores them through the bucket's TLS front.
    let a = fleet.node_on(LEASE_TTL, &bucket_url, &tls);
    assert_eq!(post_acked(&a, "t"), 1);
    assert_eq!(post_acked(&a, "t"), 2);
    drop(a);
    let b = fleet.node_on(LEASE_TTL, &bucket_url, &tls);
    let r = until_200("the next node to serve it", || get(&b, "t"));
    assert_eq!(value(&r), 2);
    assert!(front.handshakes() >= 2, "the bucket was reached over TLS");
    drop(b);

    // One part short: start-up fails naming the setting to look at.
    let refused = |change: &[(&str, Option<&str>)], setting: &str, says: &str| {
        let address = format!("127.0.0.1:{}", fleet_support::free_port());
        let mut env: Vec<(String, String)> = fleet
            .settings(&address, LEASE_TTL, &bucket_url)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        env.extend(tls.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        for (name, value) in change {
            env.retain(|(k, _)| k != name);
            if let Some(v) = value {
                env.push((name.to_string(), v.to_string()));
            }
        }
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let data = fleet_support::temp_dir("fleet-tls-refused");
        let out = run_to_exit(&mut combd_command(&data, &env));
        let _ = std::fs::remove_dir_all(&data);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{change:?}: it started: {stderr}");
        assert!(stderr.contains(setting), "{change:?}: {stderr}");
        assert!(stderr.contains(says), "{change:?}: {stderr}");
        assert!(
            !stderr.contains("not-the-password"),
            "a password is never shown: {stderr}"
        );
    };
    let wrong = show(&wrong_password);
    refused(
        &[("COMBD_FLEET_ETCD_PASSWORD_FILE", Some(&wrong))],
        "COMBD_FLEET_ETCD_USER",
        "authentication failed",
    );
    refused(
        &[
            ("COMBD_FLEET_ETCD_USER", None),
            ("COMBD_FLEET_ETCD_PASSWORD_FILE", None),
        ],
        "COMBD_FLEET_ETCD",
        "user name is empty",
    );
    // etcd's certificate is not the other authority's, nor one of the Mozilla roots.
    let other = write("other-ca.pem", &Authority::new("some other authority").pem);
    let other = show(&other);
    refused(
        &[("COMBD_FLEET_CA_FILE", Some(&other))],
        "COMBD_FLEET_ETCD",
        "invalid peer certificate",
    );
    refused(
        &[("COMBD_FLEET_CA_FILE", None)],
        "COMBD_FLEET_ETCD",
        "invalid peer certificate",
    );
    // Without its client certificate etcd takes no connection from it.
    refused(
        &[
            ("COMBD_FLEET_ETCD_CERT_FILE", None),
            ("COMBD_FLEET_ETCD_KEY_FILE", None),
        ],
        "COMBD_FLEET_ETCD",
        "unreachable",
    );
    // A file that is not what it should be is named before anything is dialled.
    let garbage = write("garbage.pem", "not a certificate\n");
    let garbage = show(&garbage);
    refused(
        &[("COMBD_FLEET_ETCD_CERT_FILE", Some(&garbage))],
        "COMBD_FLEET_ETCD_CERT_FILE",
        "no certificate",
    );
    // An etcd that takes the node's TLS handshake and then never answers its authentication
    // (a TLS front before a listener that takes connections and says nothing): past
    // fleet_authenticate_timeout_ms (2 s) start-up fails, naming the user's setting.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().flatten().collect();
        drop(held);
    });
    let mute = TlsFront::start(silent_addr, &server);
    let mute_etcd = format!("https://{}", mute.addr);
    refused(
        &[("COMBD_FLEET_ETCD", Some(&mute_etcd))],
        "COMBD_FLEET_ETCD_USER",
        "timed out",
    );
    assert_eq!(
        mute.handshakes(),
        1,
        "the handshake was done: the answer timed out"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
