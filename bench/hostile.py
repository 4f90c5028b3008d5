#!/usr/bin/env python3
"""Attacks on a node, each beside an honest client, as an attacker on the internet would
send them (not as the benchmarks do). Standard library only.

Usage: bench/hostile.py [--node BIN] [--droplet] [--seconds S] ATTACK [ATTACK...]
       bench/hostile.py --list

For each attack it starts a fresh node (under tools/droplet, one CPU and 1 GiB, with
--droplet), runs an honest client alone for S seconds (the baseline), then the honest client
beside the attack for S seconds, and prints one JSON line: the node's RSS before and at its peak
(VmRSS, sampled every 20 ms) against its memory budget, the honest client's p50/p99 and its
failed requests in both runs, and what the node refused (its /stats counters that moved).

Three honest clients run together: one writes a counter (POST /o/counter/honest) every 10 ms
on its own keep-alive connection from 127.0.0.9, reconnecting if the node closes it (a request
not answered 200 is lost); one reads the same counter (GET, no sync to wait for) every 10 ms
from 127.0.0.10; the third views page 0 of a million board from 127.0.0.7 and clicks every
10 ms, waiting for each click in the board's updates (a click not echoed is lost). With
--droplet their threads run at real-time priority (SCHED_FIFO, where allowed): they share the
clients' CPU with the attacker, and their latencies are to measure the node, not that CPU.
Attackers come from other loopback addresses (127.0.0.x); nothing leaves the machine. Each
attack is a function below (its docstring says what it sends); the node holds each address to
a share of each pool it shares (README, "Fair shares"), so the honest clients are other
clients. The attack runs in a process of its own (not beside the honest clients under one
interpreter lock) and, with --droplet, every client runs on the CPUs other than the node's.
"""

import argparse
import collections
import inspect
import json
import multiprocessing
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COUNTERS = [
    "address_conns_refused", "address_rate_refused", "local_conns_refused", "refused_late",
    "inbound_refused", "inbound_waits", "mailbox_refused", "ws_protocol_closed",
    "ws_slow_closed", "request_timeouts", "tls_handshakes_refused", "tls_hello_timeouts",
    "responses_4xx", "responses_5xx", "listen_stops", "slow_reads_paced",
    "objects_open_refused", "objects_refused_rate",
    "objects_refused_count", "ws_rate_closed", "ws_inflate_ratio_closed",
    "ws_inflate_rate_closed", "outbound_budget_closed", "pipeline_held_waits", "idle_closed",
    "alarm_wakes_refused",
] + [f"fair_{pool}_{why}" for pool in ("objects", "tls_handshakes", "answer_bytes",
                                       "inbound_bytes", "object_creations")
     for why in ("refused_share", "refused_full")]


class Node:
    def __init__(self, binary, droplet, env):
        self.data = tempfile.mkdtemp(prefix="combd-hostile-")
        full_env = {**os.environ, "COMBD_LISTEN": "127.0.0.2:0", "COMBD_DATA": self.data,
                    "COMBD_LOG": "warn", **env}
        cmd = [binary]
        if droplet:
            cmd = [os.path.join(ROOT, "tools/droplet"), "--"] + cmd
        self.proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE)
        line = self.proc.stdout.readline().decode()
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        self.port = int(words["local"].rsplit(":", 1)[1])
        self.tls_port = int(words["tls"].rsplit(":", 1)[1]) if "tls" in words else None
        self.pid = self.stats()["pid"]

    def stats(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
        s.close()
        return json.loads(data.split(b"\r\n\r\n", 1)[1])

    def rss(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def connect(port, src, timeout=10):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.2", port))
    return s


def read_response(f):
    """Reads one content-length framed response from a file object; its status."""
    line = f.readline()
    if not line:
        raise ConnectionError("closed")
    status = int(line.split()[1])
    length = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b""):
            break
        k, _, v = h.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    f.read(length)
    return status


WRITE = b"POST /o/counter/honest HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1"
READ = b"GET /o/counter/honest HTTP/1.1\r\nHost: x\r\n\r\n"


def honest(port, seconds, out, req=WRITE, src="127.0.0.9", key=""):
    """Sends `req` every 10 ms for `seconds` from `src`; latencies in ms and failures into
    `out` (under `key`latencies and `key`failed)."""
    realtime(out)
    lat, failed = [], 0
    end = time.time() + seconds
    s = f = None
    while time.time() < end:
        t0 = time.time()
        try:
            if s is None:
                s = connect(port, src)
                f = s.makefile("rb")
            s.sendall(req)
            ok = read_response(f) == 200
        except (OSError, ValueError, IndexError):
            ok = False
            s = f = None
        if ok:
            lat.append((time.time() - t0) * 1000)
        else:
            failed += 1
        time.sleep(max(0.0, 0.010 - (time.time() - t0)))
    out[key + "latencies"], out[key + "failed"] = lat, failed


def ws_frame(text):
    """A masked client text frame."""
    data = text.encode()
    mask = os.urandom(4)
    n = len(data)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def ws_read(f):
    """One server frame from a file object: (opcode, payload)."""
    h = f.read(2)
    if len(h) < 2:
        raise ConnectionError("closed")
    n = h[1] & 0x7F
    if n == 126:
        n = int.from_bytes(f.read(2), "big")
    elif n == 127:
        n = int.from_bytes(f.read(8), "big")
    return h[0] & 0x0F, f.read(n)


def clicker(port, seconds, out):
    """A viewer of a million board clicking every 10 ms for `seconds`, each click waited for
    in the board's updates; a click not echoed (or a connection that ends) is lost."""
    realtime(out)
    lat, lost = [], 0
    end = time.time() + seconds
    s = f = None
    seq = 0
    while time.time() < end:
        try:
            if s is None:
                s = connect(port, "127.0.0.7")
                s.sendall(b"GET /o/million/honest?page=0 HTTP/1.1\r\nHost: x\r\n"
                          b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                          b"Sec-WebSocket-Version: 13\r\n\r\n")
                f = s.makefile("rb")
                while f.readline() not in (b"\r\n", b""):
                    pass
                ws_read(f)  # the page
            seq += 1
            t0 = time.time()
            s.sendall(ws_frame(json.dumps({"t": "click", "i": seq % 4096, "c": seq})))
            while True:
                op, payload = ws_read(f)
                if op == 0x8:
                    raise ConnectionError("closed")
                if op == 0x1:
                    m = json.loads(payload)
                    if m.get("t") == "set" and any(u[3] == seq for u in m["u"]):
                        break
            lat.append((time.time() - t0) * 1000)
        except (OSError, ValueError, KeyError, IndexError):
            lost += 1
            s = f = None
        time.sleep(max(0.0, 0.010 - (time.time() - t0)) if s else 0.01)
    out["click_latencies"], out["clicks_lost"] = lat, lost


def realtime(out):
    """With `REALTIME` set (--droplet), puts the calling thread at real-time priority
    (SCHED_FIFO, reset in any child it forks); `out["realtime"]` says whether it could."""
    if not REALTIME:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(10))
    except (OSError, AttributeError):
        out["realtime"] = False
        return
    out.setdefault("realtime", True)


REALTIME = False


def both(port, seconds, out):
    """The honest clients together (each in a thread of its own)."""
    threads = [threading.Thread(target=clicker, args=(port, seconds, out)),
               threading.Thread(target=honest, args=(port, seconds, out)),
               threading.Thread(target=honest,
                                args=(port, seconds, out, READ, "127.0.0.10", "read_"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, int(len(v) * p / 100))], 2)


# ----------------------------------------------------------------------------------------
# The attacks. Each runs until `stop` is set, from its own loopback addresses.
# ----------------------------------------------------------------------------------------

def pipeline(node, stop, conns=60):
    """One 64 KiB write of pipelined requests (an object's, then page GETs) per connection,
    never read."""
    post = b"POST /o/counter/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1"
    get = b"GET /million/ HTTP/1.1\r\nHost: x\r\n\r\n"
    burst = post
    while len(burst) + len(get) <= 65536:
        burst += get
    held = []
    for i in range(conns):
        s = connect(node.port, f"127.0.0.{100 + i % 100}")
        s.sendall(burst)
        held.append(s)
    stop.wait()


def address_flood(node, stop, conns=3000):
    """3,000 connections from one address, held (the node is capped at 2,500)."""
    held = []
    for _ in range(conns):
        if stop.is_set():
            break
        try:
            held.append(connect(node.port, "127.0.0.60"))
        except OSError:
            pass
    stop.wait()


def big_frames(node, stop, conns=8):
    """8 WebSockets at a board sending 1 MB messages as fast as they may, reconnecting
    when closed."""
    def one(i):
        payload = b"x" * (1 << 20)
        mask = b"\x01\x02\x03\x04"
        masked = bytes(b ^ mask[j % 4] for j, b in enumerate(payload[:4])) * (len(payload) // 4)
        frame = b"\x81\xff" + len(payload).to_bytes(8, "big") + mask + masked
        while not stop.is_set():
            try:
                s = connect(node.port, f"127.0.0.{70 + i}")
                s.sendall(b"GET /o/million/b?page=0 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                          b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                          b"Sec-WebSocket-Version: 13\r\n\r\n")
                s.recv(4096)
                while not stop.is_set():
                    s.sendall(frame)
            except OSError:
                pass
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(conns)]
    for t in threads:
        t.start()
    stop.wait()


def slow_bodies(node, stop, conns=2000):
    """Connections that declare a 1 MiB body and send 1 KiB of it, then nothing, over 20
    addresses."""
    held = []
    head = b"POST /o/echo/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n" + b"s" * 1024
    for i in range(conns):
        if stop.is_set():
            break
        try:
            s = connect(node.port, f"127.0.0.{120 + i % 20}")
            s.sendall(head)
            held.append(s)
        except OSError:
            pass
    stop.wait()


def slowloris(node, stop, conns=2000):
    """Connections that send a request head one byte at a time, every 100 ms, over 20
    addresses."""
    socks = []
    for i in range(conns):
        try:
            socks.append(connect(node.port, f"127.0.0.{150 + i % 20}"))
        except OSError:
            pass
    text = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10000
    pos = 0
    while not stop.is_set():
        for s in list(socks):
            try:
                s.send(text[pos:pos + 1])
            except OSError:
                socks.remove(s)
        pos = (pos + 1) % len(text)
        stop.wait(0.1)


def name_spray(node, stop, names=10000):
    """GETs of 10,000 distinct counter names, pipelined 100 at a time on 10 connections."""
    def one(i):
        s = connect(node.port, f"127.0.0.{180 + i}")
        f = s.makefile("rb")
        for start in range(i * names // 10, (i + 1) * names // 10, 100):
            if stop.is_set():
                return
            burst = b"".join(b"GET /o/counter/spray%d HTTP/1.1\r\nHost: x\r\n\r\n" % n
                             for n in range(start, start + 100))
            s.sendall(burst)
            for _ in range(100):
                read_response(f)
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.wait()


def silent_tls(node, stop, conns=2000, report=None):
    """2,000 TCP connections to the TLS port over 10 addresses that send nothing; beside them a
    real client makes a TLS handshake and a request every 100 ms (its times in the report)."""
    held = []
    for i in range(conns):
        try:
            held.append(connect(node.tls_port, f"127.0.0.{200 + i % 10}"))
        except OSError:
            pass
    tls_client(node, stop, report)
    if report is not None:
        report["silent_sockets"] = len(held)


def statuses(f, n, tally):
    """Reads `n` responses from `f`, counting each status in `tally`."""
    for _ in range(n):
        tally[str(read_response(f))] += 1


def reminder_pipeline(node, stop, reminders=2000, conns=8, depth=8, report=None):
    """2,000 reminders of 1 KiB of text that JSON-escapes to 6 bytes a character ("\\u0001"),
    due in an hour, posted pipelined (100 at a time on 4 connections), then `GET` of their
    list pipelined 8 deep on 8 connections with a 4 KiB receive buffer that never read, all
    from one address."""
    src = "127.0.0.30"
    body = json.dumps({"in_ms": 3600000, "text": "\x01" * 1024}).encode()
    post = (b"POST /o/reminder/pile HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % len(body)) + body
    tally = collections.Counter()

    def poster(count):
        try:
            s = connect(node.port, src)
            f = s.makefile("rb")
            for start in range(0, count, 100):
                if stop.is_set():
                    return
                n = min(100, count - start)
                s.sendall(post * n)
                statuses(f, n, tally)
            s.close()
        except (OSError, ValueError, IndexError):
            tally["connection ended"] += 1

    t0 = time.time()
    threads = [threading.Thread(target=poster, args=(reminders // 4,), daemon=True)
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    posted_s = time.time() - t0
    get = b"GET /o/reminder/pile HTTP/1.1\r\nHost: x\r\n\r\n"
    held = []
    for _ in range(conns):
        try:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.bind((src, 0))
            s.settimeout(10)
            s.connect(("127.0.0.2", node.port))
            s.sendall(get * depth)
            held.append(s)
        except OSError:
            pass
    stop.wait()
    if report is not None:
        report.update({"reminder_posts": dict(tally), "reminder_posts_s": round(posted_s, 2),
                       "unread_conns": len(held)})


def deflate_bomb():
    """A masked permessage-deflate binary frame of ~1 KiB whose message inflates to just
    under 1 MiB (`COMBD_WS_MAX_MESSAGE`)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = c.compress(b"a" * ((1 << 20) - 64)) + c.flush(zlib.Z_SYNC_FLUSH)
    data = data[:-4]  # RFC 7692: the 00 00 ff ff tail is left off
    mask = b"\x11\x22\x33\x44"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return bytes([0xC2, 0x80 | 126]) + len(data).to_bytes(2, "big") + mask + masked


def ws_open(port, src, path, extensions, rcvbuf=None):
    """A WebSocket to `path` offering `extensions`; the socket and the 101's extensions."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((src, 0))
    s.settimeout(10)
    s.connect(("127.0.0.2", port))
    s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
              b"Sec-WebSocket-Extensions: %s\r\n\r\n" % (path.encode(), extensions.encode()))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            raise ConnectionError("closed before the 101")
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(head.split(b"\r\n", 1)[0].decode())
    ext = [h.split(b":", 1)[1].strip().decode() for h in head.split(b"\r\n")
           if h.lower().startswith(b"sec-websocket-extensions:")]
    return s, (ext[0] if ext else "")


OFFERS = ["permessage-deflate; server_max_window_bits=8", "permessage-deflate"]


def deflate_bombs(node, stop, conns=10, frames=62, report=None):
    """10 WebSockets at the echo app from one address (half offering
    `server_max_window_bits=8`, half plain permessage-deflate), each sending 62 frames of
    ~1 KiB that inflate to 1 MiB and never reading (4 KiB receive buffer); one more frame a
    second after, and a socket the node has closed is opened again."""
    frame = deflate_bomb()
    tally = collections.Counter()

    def one(i):
        s = None
        while not stop.is_set():
            try:
                if s is None:
                    s, ext = ws_open(node.port, "127.0.0.31", f"/o/echo/bomb{i}",
                                     OFFERS[i % 2], rcvbuf=4096)
                    tally["opened"] += 1
                    tally["negotiated: " + (ext or "none")] += 1
                    s.settimeout(2)
                    for _ in range(frames):
                        s.sendall(frame)
                    tally["frames"] += frames
                stop.wait(1)
                s.sendall(frame)
                tally["frames"] += 1
            except (OSError, ConnectionError) as e:
                tally["ended: " + type(e).__name__] += 1
                if s is not None:
                    s.close()
                s = None
                stop.wait(0.1)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(conns)]
    for t in threads:
        t.start()
    stop.wait()
    if report is not None:
        report["bombs"] = dict(tally)


def deflate_cpu(node, stop, conns=4, rate=900, report=None):
    """The frames of `deflate_bombs` at 900 a second on each of 4 WebSockets at the echo app
    from one address (plain permessage-deflate), each read by a thread of its own; a socket
    the node closes (its close frame read, or a write failing) is opened again at once, the
    frames keeping their pace."""
    frame = deflate_bomb()
    tally = collections.Counter()

    def reader(s, closed):
        try:
            f = s.makefile("rb")
            while True:
                op, payload = ws_read(f)
                if op == 0x8:
                    code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 0
                    tally[f"closed {code}"] += 1
                    return
                tally["messages in"] += 1
        except (OSError, ConnectionError, ValueError):
            return
        finally:
            closed.set()

    def one(i):
        s = closed = None
        t0 = time.time()
        sent = 0
        while not stop.is_set():
            try:
                if s is None or closed.is_set():
                    if s is not None:
                        s.close()
                    s = None
                    s, _ = ws_open(node.port, "127.0.0.32", f"/o/echo/cpu{i}", OFFERS[1])
                    tally["opened"] += 1
                    closed = threading.Event()
                    threading.Thread(target=reader, args=(s, closed), daemon=True).start()
                due = int((time.time() - t0) * rate) - sent
                if due > 0:
                    s.sendall(frame * due)
                    sent += due
                    tally["frames"] += due
                time.sleep(0.005)
            except (OSError, ConnectionError) as e:
                tally["ended: " + type(e).__name__] += 1
                if s is not None:
                    s.close()
                s = None
                sent = int((time.time() - t0) * rate)
                stop.wait(0.01)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(conns)]
    for t in threads:
        t.start()
    stop.wait()
    if report is not None:
        report["deflate"] = dict(tally)


def tls_client(node, stop, report, src="127.0.0.8"):
    """A real client making a TLS handshake and a request every 100 ms until `stop`; its
    handshakes completed and failed, and their times, into `report`."""
    import ssl
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    times, failed = [], 0
    while not stop.is_set():
        t0 = time.time()
        try:
            raw = connect(node.tls_port, src)
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                ok = s.recv(64).startswith(b"HTTP/1.1 200")
        except (OSError, ssl.SSLError):
            ok = False
        if ok:
            times.append((time.time() - t0) * 1000)
        else:
            failed += 1
        stop.wait(0.1)
    if report is not None:
        report.update({"tls_client_ok": len(times), "tls_client_failed": failed,
                       "tls_client_p50_ms": pct(times, 50), "tls_client_max_ms":
                       round(max(times), 2) if times else None})


def client_hello():
    """One ClientHello, as Python's ssl module sends it (made once, in memory)."""
    import ssl
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    out = ssl.MemoryBIO()
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def canned_hello(node, stop, rate=100, report=None):
    """One ClientHello replayed 100 times a second from one address on new connections to the
    TLS port, each then silent (never read, never closed); a real client's handshakes beside
    them (`tls_client`, from another address)."""
    hello = client_hello()
    held, failed = [], 0

    def replay():
        nonlocal failed
        t0 = time.time()
        n = 0
        while not stop.is_set():
            if n >= (time.time() - t0) * rate:
                time.sleep(0.002)
                continue
            n += 1
            try:
                s = connect(node.tls_port, "127.0.0.33")
                s.sendall(hello)
                held.append(s)
            except OSError:
                failed += 1

    threading.Thread(target=replay, daemon=True).start()
    tls_client(node, stop, report)
    if report is not None:
        report.update({"hello_bytes": len(hello), "hellos_sent": len(held),
                       "hellos_failed": failed})


def keepalive(node, src, stop, requests, tally):
    """Sends each request of the iterable `requests` on a keep-alive connection from `src`,
    one at a time, until `stop`; counts the statuses (and connections the node ended)."""
    s = f = None
    for req in requests:
        if stop.is_set():
            break
        try:
            if s is None:
                s = connect(node.port, src)
                f = s.makefile("rb")
            s.sendall(req)
            tally[str(read_response(f))] += 1
        except (OSError, ValueError, IndexError):
            tally["connection ended"] += 1
            s = f = None
            stop.wait(0.01)


def object_fill(node, stop, objects=1100, conns=16, report=None):
    """1,100 counters made live from one address (a POST each), then read in a loop (GET)
    on 16 keep-alive connections."""
    tally = collections.Counter()
    post = b"POST /o/counter/fill%d HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1"
    get = b"GET /o/counter/fill%d HTTP/1.1\r\nHost: x\r\n\r\n"

    def requests(i):
        for n in range(i, objects, conns):
            yield post % n
        while True:
            for n in range(i, objects + i):
                yield get % (n % objects)

    threads = [threading.Thread(target=keepalive,
                                args=(node, "127.0.0.34", stop, requests(i), tally),
                                daemon=True) for i in range(conns)]
    for t in threads:
        t.start()
    stop.wait()
    if report is not None:
        report["attacker_statuses"] = dict(tally)


def new_names(node, stop, conns=8, report=None):
    """POSTs to a new counter name each, one at a time on 8 keep-alive connections from one
    address."""
    tally = collections.Counter()
    tag = os.getpid()

    post = b"POST /o/counter/new%d-%d-%d HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1"

    def requests(i):
        n = 0
        while True:
            n += 1
            yield post % (tag, i, n)

    threads = [threading.Thread(target=keepalive,
                                args=(node, "127.0.0.35", stop, requests(i), tally),
                                daemon=True) for i in range(conns)]
    for t in threads:
        t.start()
    stop.wait()
    if report is not None:
        report["attacker_statuses"] = dict(tally)


def trickle_bodies(node, stop, conns=1024, chunk=1024, every=0.2, report=None):
    """1,024 connections from one address, each declaring `Content-Length: 1048576` to the
    echo app and sending 1 KiB of it every 200 ms; a connection the node ends is opened again
    (at most 64 a round)."""
    head = b"POST /o/echo/trickle HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n"
    part = b"t" * chunk
    socks = [None] * conns
    tally = collections.Counter()
    while not stop.is_set():
        t0 = time.time()
        opened = 0
        for i in range(conns):
            if stop.is_set():
                break
            s = socks[i]
            try:
                if s is None:
                    if opened >= 64 and tally["opened"] >= conns:
                        continue
                    s = connect(node.port, "127.0.0.36")
                    s.sendall(head)
                    s.setblocking(False)
                    socks[i] = s
                    opened += 1
                    tally["opened"] += 1
                s.send(part)
                tally["bytes"] += chunk
            except BlockingIOError:
                tally["send would block"] += 1
            except OSError:
                tally["ended"] += 1
                if s is not None:
                    s.close()
                socks[i] = None
        stop.wait(max(0.0, every - (time.time() - t0)))
    if report is not None:
        report["trickle"] = dict(tally)


ATTACKS = {
    "pipeline": (pipeline, {}),
    "address-flood": (address_flood, {"COMBD_MAX_CONNS": "2500", "COMBD_HEADER_TIMEOUT": "1m"}),
    "big-frames": (big_frames, {}),
    "slow-bodies": (slow_bodies, {"COMBD_BODY_TIMEOUT": "1m"}),
    "slowloris": (slowloris, {}),
    "name-spray": (name_spray, {}),
    "silent-tls": (silent_tls, {"tls": True}),
    "reminder-pipeline": (reminder_pipeline, {}),
    "deflate-bombs": (deflate_bombs, {}),
    "deflate-cpu": (deflate_cpu, {}),
    "canned-hello": (canned_hello, {"tls": True}),
    "object-fill": (object_fill, {}),
    "new-names": (new_names, {}),
    "trickle-bodies": (trickle_bodies, {}),
}


def object_files(data):
    """Database files under the node's data directory."""
    n = 0
    for _, _, files in os.walk(os.path.join(data, "objects")):
        n += sum(1 for f in files if f.endswith(".sqlite"))
    return n


def tls_env():
    """A certificate for the TLS attacks (made by combd-bench gen-cert, or by openssl where
    combd-bench is not built) and the settings."""
    d = tempfile.mkdtemp(prefix="combd-hostile-cert-")
    bench = os.path.join(ROOT, "target/release/combd-bench")
    if os.path.exists(bench):
        subprocess.run([bench, "gen-cert", d], check=True, stdout=subprocess.DEVNULL)
    else:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                        "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                        "-keyout", os.path.join(d, "key.pem"), "-out", os.path.join(d, "cert.pem")],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"COMBD_TLS_LISTEN": "127.0.0.2:0", "COMBD_TLS_CERT": os.path.join(d, "cert.pem"),
            "COMBD_TLS_KEY": os.path.join(d, "key.pem")}


def attack_process(attack, node, stop, reports):
    """Runs `attack` until `stop` is set, then puts its report (or an empty one) on `reports`."""
    report = {}
    kwargs = {"report": report} if "report" in inspect.signature(attack).parameters else {}
    t = threading.Thread(target=attack, args=(node, stop), kwargs=kwargs, daemon=True)
    t.start()
    stop.wait()
    t.join(timeout=10)
    reports.put(report)


def run(name, binary, droplet, seconds):
    attack, env = ATTACKS[name]
    env = dict(env)
    if env.pop("tls", False):
        env.update(tls_env())
    node = Node(binary, droplet, env)
    # On the droplet the node has CPU 0 to itself (tools/droplet pins it there); the clients,
    # honest and hostile, run on the other CPUs, as a droplet's clients are elsewhere.
    others = set(range(os.cpu_count() or 1)) - {0}
    if droplet and others:
        os.sched_setaffinity(0, others)
    try:
        base_out = {}
        both(node.port, seconds, base_out)
        before = node.stats()
        rss_base = node.rss()
        # The attack runs in a process of its own: in this one, its threads would hold the
        # interpreter's lock while the honest clients wait for it, and their latencies would
        # measure Python, not the node.
        ctx = multiprocessing.get_context("fork")
        stop = ctx.Event()
        reports = ctx.Queue()
        attacker = ctx.Process(target=attack_process, args=(attack, node, stop, reports),
                               daemon=True)
        attacker.start()
        # The sampler below runs as the honest clients do: they share the interpreter's lock
        # with it, and a sampler preempted by the attacker while holding it would stall them.
        realtime({})
        out = {}
        h = threading.Thread(target=both, args=(node.port, seconds, out))
        h.start()
        peak = rss_base
        while h.is_alive():
            peak = max(peak, node.rss())
            time.sleep(0.02)
        stop.set()
        try:
            report = reports.get(timeout=20)
        except queue.Empty:
            report = {"attack_report": "none (the attack did not stop in time)"}
        attacker.join(timeout=10)
        if attacker.is_alive():
            attacker.kill()
        try:
            after = node.stats()
        except OSError:
            # The node died under the attack (the droplet's cgroup killed it, say).
            return {"attack": name, "node": binary, "droplet": droplet, "seconds": seconds,
                    "rss_base_mb": round(rss_base / 2**20, 1),
                    "rss_peak_mb": round(peak / 2**20, 1), "node_died": True,
                    "honest_alone_p99_ms": pct(base_out["latencies"], 99),
                    "honest_p99_ms": pct(out["latencies"], 99),
                    "honest_requests": len(out["latencies"]), "honest_failed": out["failed"]}
        moved = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS
                 if after.get(k, 0) != before.get(k, 0)}
        return {
            "attack": name, "node": binary, "droplet": droplet, "seconds": seconds,
            "rss_base_mb": round(rss_base / 2**20, 1), "rss_peak_mb": round(peak / 2**20, 1),
            "memory_budget_mb": round(after["memory_budget_bytes"] / 2**20),
            "pressure_after": after["pressure"], "tcp_refusing_after": after["tcp_refusing"],
            "honest_alone_p50_ms": pct(base_out["latencies"], 50),
            "honest_alone_p99_ms": pct(base_out["latencies"], 99),
            "honest_alone_failed": base_out["failed"],
            "honest_p50_ms": pct(out["latencies"], 50), "honest_p99_ms": pct(out["latencies"], 99),
            "honest_requests": len(out["latencies"]), "honest_failed": out["failed"],
            "clicker_alone_p99_ms": pct(base_out["click_latencies"], 99),
            "clicker_p50_ms": pct(out["click_latencies"], 50),
            "clicker_p99_ms": pct(out["click_latencies"], 99),
            "clicks": len(out["click_latencies"]), "clicks_lost": out["clicks_lost"],
            "reader_alone_p99_ms": pct(base_out["read_latencies"], 99),
            "reader_p50_ms": pct(out["read_latencies"], 50),
            "reader_p99_ms": pct(out["read_latencies"], 99),
            "reads": len(out["read_latencies"]), "reads_failed": out["read_failed"],
            "sync_p99_us_alone": before.get("stages", {}).get("sync", {}).get("p99_us"),
            "sync_p99_us_end": after.get("stages", {}).get("sync", {}).get("p99_us"),
            "stages_p99_us_end": {k: v.get("p99_us") for k, v in after.get("stages", {}).items()},
            "honest_realtime": out.get("realtime", False),
            "refused": moved,
            "object_files": object_files(node.data),
            "clients_cpus": sorted(os.sched_getaffinity(0)),
            **report,
        }
    except OSError as e:
        return {"attack": name, "node": binary, "error": str(e)}
    finally:
        node.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--node", default=os.path.join(ROOT, "target/release/combd"))
    ap.add_argument("--droplet", action="store_true")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("attacks", nargs="*")
    a = ap.parse_args()
    global REALTIME
    REALTIME = a.droplet
    # The honest clients' three threads share the interpreter's lock: hand it over within
    # half a millisecond, not Python's default 5 ms, so one's parsing does not delay another.
    sys.setswitchinterval(0.0005)
    if a.list or not a.attacks:
        print("\n".join(ATTACKS))
        return
    for name in a.attacks:
        if name not in ATTACKS:
            sys.exit(f"unknown attack {name}; see --list")
        print(json.dumps(run(name, a.node, a.droplet, a.seconds)), flush=True)


if __name__ == "__main__":
    main()
