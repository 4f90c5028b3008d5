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

Two honest clients run together: one writes a counter (POST /o/counter/honest) every 10 ms on
its own keep-alive connection from 127.0.0.9, reconnecting if the node closes it (a request
not answered 200 is lost); the other views page 0 of a million board from 127.0.0.7 and clicks
every 10 ms, waiting for each click in the board's updates (a click not echoed is lost).
Attackers come from other loopback addresses (127.0.0.x); nothing leaves the machine. The attack
runs in a process of its own (not beside the honest clients under one interpreter lock) and,
with --droplet, every client runs on the CPUs other than the node's.
"""

import argparse
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COUNTERS = [
    "address_conns_refused", "address_rate_refused", "local_conns_refused", "refused_late",
    "inbound_refused", "inbound_waits", "mailbox_refused", "ws_protocol_closed",
    "ws_slow_closed", "request_timeouts", "tls_handshakes_refused", "tls_hello_timeouts",
    "responses_4xx", "responses_5xx", "listen_stops", "slow_reads_paced",
]


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


def honest(port, seconds, out):
    """POSTs a counter every 10 ms for `seconds`; latencies in ms and failures into `out`."""
    lat, failed = [], 0
    end = time.time() + seconds
    s = f = None
    req = b"POST /o/counter/honest HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1"
    while time.time() < end:
        t0 = time.time()
        try:
            if s is None:
                s = connect(port, "127.0.0.9")
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
    out["latencies"], out["failed"] = lat, failed


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


def both(port, seconds, out):
    """The honest HTTP client and the honest clicker together."""
    c = threading.Thread(target=clicker, args=(port, seconds, out))
    c.start()
    honest(port, seconds, out)
    c.join()


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
    import ssl
    held = []
    for i in range(conns):
        try:
            held.append(connect(node.tls_port, f"127.0.0.{200 + i % 10}"))
        except OSError:
            pass
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    times, failed = [], 0
    while not stop.is_set():
        t0 = time.time()
        try:
            raw = connect(node.tls_port, "127.0.0.8")
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
                       round(max(times), 2) if times else None,
                       "silent_sockets": len(held)})


ATTACKS = {
    "pipeline": (pipeline, {}),
    "address-flood": (address_flood, {"COMBD_MAX_CONNS": "2500", "COMBD_HEADER_TIMEOUT": "1m"}),
    "big-frames": (big_frames, {}),
    "slow-bodies": (slow_bodies, {"COMBD_BODY_TIMEOUT": "1m"}),
    "slowloris": (slowloris, {}),
    "name-spray": (name_spray, {}),
    "silent-tls": (silent_tls, {"tls": True}),
}


def object_files(data):
    """Database files under the node's data directory."""
    n = 0
    for _, _, files in os.walk(os.path.join(data, "objects")):
        n += sum(1 for f in files if f.endswith(".sqlite"))
    return n


def tls_env():
    """A certificate for the TLS attack (made by combd-bench gen-cert) and the settings."""
    d = tempfile.mkdtemp(prefix="combd-hostile-cert-")
    subprocess.run([os.path.join(ROOT, "target/release/combd-bench"), "gen-cert", d],
                   check=True, stdout=subprocess.DEVNULL)
    return {"COMBD_TLS_LISTEN": "127.0.0.2:0", "COMBD_TLS_CERT": os.path.join(d, "cert.pem"),
            "COMBD_TLS_KEY": os.path.join(d, "key.pem")}


def attack_process(attack, node, stop, reports):
    """Runs `attack` until `stop` is set, then puts its report (or an empty one) on `reports`."""
    report = {}
    kwargs = {"report": report} if attack is silent_tls else {}
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
    if a.list or not a.attacks:
        print("\n".join(ATTACKS))
        return
    for name in a.attacks:
        if name not in ATTACKS:
            sys.exit(f"unknown attack {name}; see --list")
        print(json.dumps(run(name, a.node, a.droplet, a.seconds)), flush=True)


if __name__ == "__main__":
    main()
