#!/usr/bin/env python3
"""Counter load with a client history, for tools/fleet-netns/run --history (run inside a node's
or the clients' network namespace).

    load.py --out FILE --target HOST:PORT --path /o/counter/f --id-base N
            [--writers 1] [--readers 1] [--timeout 5] [--read-every-ms 20] --stop FILE

Each writer sends `POST PATH` one at a time on a keep-alive connection, each reader `GET PATH`
(then waits --read-every-ms), until the file --stop exists. Every request is one operation of
the history, written to --out as JSON lines (the format tools/fleet-killloop --history writes,
tools/linearize/README.md): an invoke event just before the request is sent and a completion
just after its answer is read, times from time.monotonic_ns() (CLOCK_MONOTONIC, one clock for
every namespace of the machine, so histories from several namespaces merge). `ok` is a 200 with
its value; `fail` a connection that could not be made (nothing was sent) or a 4xx; `info`
anything else (a 5xx, a reset, a time-out). Operation ids and processes start at --id-base; a
client's process is replaced by a new one after an operation of unknown outcome (it never ends).
Python 3 standard library only.
"""
import argparse
import json
import os
import socket
import threading
import time


class Out:
    def __init__(self, path, base):
        self.f = open(path, "w")
        self.lock = threading.Lock()
        self.next = base

    def new_id(self):
        with self.lock:
            self.next += 1
            return self.next

    def write(self, ev):
        with self.lock:
            self.f.write(json.dumps(ev, separators=(",", ":")) + "\n")
            self.f.flush()


def read_response(sock, buf):
    """(status, body, rest of buf); raises ConnectionError at EOF."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("EOF")
        buf += chunk
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(buf) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("EOF in body")
        buf += chunk
    return status, buf[:length], buf[length:]


def client(a, out, f, node, stop):
    host, port = a.target.rsplit(":", 1)
    method = "POST" if f == "add" else "GET"
    raw = (f"{method} {a.path} HTTP/1.1\r\nHost: x\r\n"
           + ("Content-Length: 0\r\n" if method == "POST" else "") + "\r\n").encode()
    process = out.new_id()
    sock, buf = None, b""
    while not os.path.exists(stop):
        op = out.new_id()
        out.write({"type": "invoke", "f": f, "id": op, "process": process, "node": node,
                   "time": time.monotonic_ns()})
        kind, value, error = None, None, None
        if sock is None:
            try:
                sock = socket.create_connection((host, int(port)), timeout=a.timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buf = b""
            except OSError as e:
                # Nothing was sent.
                sock = None
                kind, error = "fail", f"connect: {e}"
        if kind is None:
            try:
                sock.sendall(raw)
                status, body, buf = read_response(sock, buf)
                if status == 200:
                    kind, value = "ok", json.loads(body)["value"]
                else:
                    try:
                        err = json.loads(body).get("error")
                    except ValueError:
                        err = body[:80].decode(errors="replace")
                    kind, error = ("fail" if 400 <= status < 500 else "info"), f"{status} {err}"
            except (OSError, ConnectionError, ValueError, KeyError) as e:
                kind, error = "info", f"{type(e).__name__}: {e}"
                try:
                    sock.close()
                except OSError:
                    pass
                sock = None
        ev = {"type": kind, "f": f, "id": op, "process": process, "time": time.monotonic_ns()}
        if kind == "ok":
            ev["value"] = value
        else:
            ev["error"] = str(error)[:120]
        out.write(ev)
        if kind == "info":
            process = out.new_id()
        if kind == "fail" or (kind == "info" and sock is None):
            time.sleep(0.05)  # the node is unreachable: bounded retries, not a spin
        elif kind != "ok":
            time.sleep(0.02)  # refused (503): again soon, not in a spin
        elif f == "read":
            time.sleep(a.read_every_ms / 1000)
    if sock is not None:
        sock.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--path", default="/o/counter/f")
    p.add_argument("--id-base", type=int, required=True)
    p.add_argument("--node", type=int, default=-1)
    p.add_argument("--writers", type=int, default=1)
    p.add_argument("--readers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--read-every-ms", type=float, default=20.0)
    p.add_argument("--stop", required=True)
    p.add_argument("--max-seconds", type=float, default=1800.0)
    a = p.parse_args()
    out = Out(a.out, a.id_base)
    stop = a.stop
    threads = [threading.Thread(target=client, args=(a, out, "add", a.node, stop), daemon=True)
               for _ in range(a.writers)]
    threads += [threading.Thread(target=client, args=(a, out, "read", a.node, stop), daemon=True)
                for _ in range(a.readers)]
    for t in threads:
        t.start()
    print("load started", flush=True)
    deadline = time.monotonic() + a.max_seconds
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not os.path.exists(stop):
        open(stop, "w").close()  # bounded in time: stop by ourselves
    for t in threads:
        t.join(a.timeout + 5)
    out.f.close()


if __name__ == "__main__":
    main()
