//! TLS scenarios: `idle-tls` (the `idle` scenario over WSS: memory per idle WSS connection) and
//! `handshakes` (full TLS handshakes one after another from one generator core: handshakes per
//! second the node completes on its one core). The certificate to trust is `--tls-cert FILE`.

use std::io::Write;
use std::net::{Ipv4Addr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;

use crate::{connect_from, cpu_seconds, local_get, percentile, rss_bytes, upgrade, Args};

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn client_config(cert: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let pem = std::fs::read(cert).map_err(|e| format!("--tls-cert {cert}: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn connect(
    config: &Arc<rustls::ClientConfig>,
    target: Ipv4Addr,
    port: u16,
    i: usize,
) -> Result<Tls, String> {
    let tcp = connect_from(target, port, i)?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(config.clone(), name).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn
            .complete_io(&mut tls.sock)
            .map_err(|e| format!("handshake: {e}"))?;
    }
    Ok(tls)
}

/// Memory per idle WSS connection.
pub fn idle_tls(a: &Args) -> Result<serde_json::Value, String> {
    let config = client_config(a.tls_cert.as_deref().ok_or("--tls-cert is required")?)?;
    let tls_port = a.tls_port.ok_or("--tls-port is required")?;
    let stats: serde_json::Value =
        serde_json::from_str(&local_get(a.port, "/stats")?).map_err(|e| e.to_string())?;
    let pid = stats["pid"].as_u64().ok_or("stats has no pid")?;
    let rss_before = rss_bytes(pid);
    let started = Instant::now();
    let mut socks = Vec::with_capacity(a.conns);
    for i in 0..a.conns {
        let mut s = connect(&config, a.target, tls_port, i)?;
        upgrade(&mut s, &format!("/o/echo/idle{}", i % 100))?;
        socks.push(s);
        if (i + 1) % 1000 == 0 {
            eprintln!(
                "idle-tls: {} open, {:.1}s",
                socks.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = rss_bytes(pid);
    Ok(serde_json::json!({
        "scenario": "idle-tls",
        "conns_open": socks.len(),
        "open_seconds": started.elapsed().as_secs_f64(),
        "node_rss_before_bytes": rss_before,
        "node_rss_after_bytes": rss_after,
        "node_user_bytes_per_conn": ((rss_after.saturating_sub(rss_before)) as f64 / socks.len().max(1) as f64).round(),
    }))
}

/// Full handshakes, one after another.
pub fn handshakes(a: &Args) -> Result<serde_json::Value, String> {
    let config = client_config(a.tls_cert.as_deref().ok_or("--tls-cert is required")?)?;
    let tls_port = a.tls_port.ok_or("--tls-port is required")?;
    let stats: serde_json::Value =
        serde_json::from_str(&local_get(a.port, "/stats")?).map_err(|e| e.to_string())?;
    let pid = stats["pid"].as_u64().ok_or("stats has no pid")?;
    let cpu0 = cpu_seconds(pid);
    let self0 = cpu_seconds(std::process::id() as u64);
    let started = Instant::now();
    let mut times = Vec::with_capacity(a.conns);
    for i in 0..a.conns {
        let t = Instant::now();
        let mut s = connect(&config, a.target, tls_port, i)?;
        times.push(t.elapsed());
        s.conn.send_close_notify();
        let _ = s.flush();
    }
    let secs = started.elapsed().as_secs_f64();
    times.sort();
    Ok(serde_json::json!({
        "scenario": "handshakes",
        "handshakes": a.conns,
        "seconds": secs,
        "handshakes_per_second": a.conns as f64 / secs,
        "handshake_p50_ms": percentile(&times, 0.5),
        "handshake_p99_ms": percentile(&times, 0.99),
        "node_cpu_percent": (cpu_seconds(pid) - cpu0) / secs * 100.0,
        "generator_cpu_percent": (cpu_seconds(std::process::id() as u64) - self0) / secs * 100.0,
    }))
}
