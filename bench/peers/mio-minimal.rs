//! The minimal server peer of the HTTP ceiling benchmark (`bench/ceiling.sh`): one thread,
//! mio (epoll), httparse, and a fixed answer to every request — no app, no limits, no stats,
//! no timeouts. It is what a request costs on this machine with nothing but parsing and the
//! syscalls, so combd's figure beside it is the price of everything else.
//!
//! Usage: `peer-mio PORT` (listens on 0.0.0.0:PORT; prints `peer ready pid=N`).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{\"status\":\"ok\"}";
const LISTENER: Token = Token(usize::MAX);

struct Client {
    stream: TcpStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
}

/// Answers every complete request at the start of `inbuf`; false on a malformed one.
fn answer(c: &mut Client) -> bool {
    let mut used = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&c.inbuf[used..]) {
            Ok(httparse::Status::Complete(n)) => {
                used += n;
                c.out.extend_from_slice(ANSWER);
            }
            Ok(httparse::Status::Partial) => break,
            Err(_) => return false,
        }
    }
    c.inbuf.drain(..used);
    true
}

fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("usage: peer-mio PORT");
    let addr: SocketAddr = ([0, 0, 0, 0], port).into();
    let mut listener = TcpListener::bind(addr).expect("bind");
    let mut poll = Poll::new().expect("poll");
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .expect("register");
    println!("peer ready pid={}", std::process::id());
    let mut clients: HashMap<usize, Client> = HashMap::new();
    let mut next = 0usize;
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if poll.poll(&mut events, None).is_err() {
            continue;
        }
        for ev in events.iter() {
            if ev.token() == LISTENER {
                while let Ok((mut stream, _)) = listener.accept() {
                    let _ = stream.set_nodelay(true);
                    next += 1;
                    if poll
                        .registry()
                        .register(&mut stream, Token(next), Interest::READABLE)
                        .is_ok()
                    {
                        let client = Client {
                            stream,
                            inbuf: Vec::new(),
                            out: Vec::new(),
                        };
                        clients.insert(next, client);
                    }
                }
                continue;
            }
            let id = ev.token().0;
            let Some(c) = clients.get_mut(&id) else {
                continue;
            };
            let mut alive = true;
            loop {
                match c.stream.read(&mut buf) {
                    Ok(0) => {
                        alive = false;
                        break;
                    }
                    Ok(n) => c.inbuf.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        alive = false;
                        break;
                    }
                }
            }
            if alive && answer(c) {
                // A blocking-style write: the answers are small and the client reads them.
                let mut pos = 0;
                while pos < c.out.len() {
                    match c.stream.write(&c.out[pos..]) {
                        Ok(n) => pos += n,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
                        Err(_) => {
                            alive = false;
                            break;
                        }
                    }
                }
                c.out.clear();
            } else {
                alive = false;
            }
            if !alive {
                if let Some(mut c) = clients.remove(&id) {
                    let _ = poll.registry().deregister(&mut c.stream);
                }
            }
        }
    }
}
