//! A TCP proxy for the tests, in front of a real server: it can hold what a client sends, or
//! cut the link.

use std::time::Duration;

/// A TCP proxy in front of `to` whose link can be cut: while cut, every connection through it
/// is closed and new ones are closed at once; or held: while held, what clients send waits in
/// the proxy (a server that stopped answering).
/// It runs until the test process ends.
pub struct Proxy {
    pub addr: std::net::SocketAddr,
    pub cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    held: Held,
}

/// Whether the proxy holds what clients send, and the event of its release.
type Held = std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>;

impl Proxy {
    pub fn start(to: std::net::SocketAddr) -> Proxy {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering::Relaxed;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = cut.clone();
        let held: Held = Default::default();
        let gate = held.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if flag.load(Relaxed) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = std::net::TcpStream::connect(to) else {
                    continue;
                };
                let pipe = |mut from: std::net::TcpStream,
                            mut to: std::net::TcpStream,
                            cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
                            gate: Option<Held>| {
                    std::thread::spawn(move || {
                        let mut buf = vec![0; 64 * 1024];
                        // A read wakes every 50 ms to see whether the link was cut.
                        from.set_read_timeout(Some(Duration::from_millis(50)))
                            .unwrap();
                        loop {
                            if cut.load(Relaxed) {
                                break;
                            }
                            let n = match from.read(&mut buf) {
                                Ok(0) => break,
                                Ok(n) => n,
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                                Err(_) => break,
                            };
                            if let Some(gate) = &gate {
                                let (lock, released) = &**gate;
                                let mut held = lock.lock().unwrap();
                                while *held {
                                    held = released.wait(held).unwrap();
                                }
                            }
                            if cut.load(Relaxed) || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    });
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(client, server, flag.clone(), Some(gate.clone()));
                pipe(s2, c2, flag.clone(), None);
            }
        });
        Proxy { addr, cut, held }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cuts the link (or mends it).
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::Relaxed);
    }

    /// Holds what clients send from now on (or lets it all through).
    pub fn set_held(&self, held: bool) {
        let (lock, released) = &*self.held;
        *lock.lock().unwrap() = held;
        released.notify_all();
    }
}

/// The host and port of an `http://host:port` endpoint.
pub mod url_like {
    pub struct Endpoint {
        pub addr: std::net::SocketAddr,
    }

    impl std::str::FromStr for Endpoint {
        type Err = String;
        fn from_str(s: &str) -> Result<Self, String> {
            let rest = s.strip_prefix("http://").ok_or("not http://")?;
            let hostport = rest.split('/').next().unwrap_or(rest);
            let addr = hostport.parse().map_err(|e| format!("{hostport}: {e}"))?;
            Ok(Endpoint { addr })
        }
    }
}
