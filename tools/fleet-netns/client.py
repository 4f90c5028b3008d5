#!/usr/bin/env python3
"""One client's requests to the fleet's name, one JSON line each (run inside the clients'
namespace by tools/fleet-netns/run).

    client.py KIND URL COUNT [ARGS]   KIND: curl | python | node | chromium

ARGS go to curl or Chromium as they are (e.g. -4; --disable-features=AsyncDns).

Every request is one request with no retry of ours, on a new connection after a new lookup of
the name (the DNS server answers with TTL 0): whatever fell through to another address, the
client did by itself. Each line: {"i", "ok", "status", "peer" (the address the client's
connection reached), "ms" (request start, lookup included, to the response's head or end),
"connect_ms" (the connect phase, every address tried), "err"}.
"""
import fcntl
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

TIMEOUT = 5


def emit(rec):
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def run_curl(url, count, extra=()):
    fmt = "%{http_code} %{remote_ip} %{time_namelookup} %{time_connect} %{time_total}"
    for i in range(count):
        p = subprocess.run(
            ["curl", "-sS", "-o", "/dev/null", "--max-time", str(TIMEOUT), *extra, "-w", fmt,
             url],
            capture_output=True, text=True)
        parts = p.stdout.split()
        if len(parts) == 5:
            code, ip, tn, tc, tt = parts
            ok = p.returncode == 0 and code == "200"
            emit({"i": i, "ok": ok, "status": int(code), "peer": ip,
                  "ms": float(tt) * 1e3, "connect_ms": (float(tc) - float(tn)) * 1e3,
                  "err": p.stderr.strip()[:200]})
        else:
            emit({"i": i, "ok": False, "status": 0, "peer": None, "ms": None,
                  "connect_ms": None, "err": (p.stderr or p.stdout).strip()[:200]})


def run_python(url, count):
    u = urllib.parse.urlsplit(url)
    for i in range(count):
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=TIMEOUT)
        try:
            conn.connect()  # getaddrinfo, then socket.create_connection's loop over the addresses
            tc = time.perf_counter()
            peer = conn.sock.getpeername()[0]
            conn.request("GET", u.path or "/")
            r = conn.getresponse()
            r.read()
            t1 = time.perf_counter()
            emit({"i": i, "ok": r.status == 200, "status": r.status, "peer": peer,
                  "ms": (t1 - t0) * 1e3, "connect_ms": (tc - t0) * 1e3, "err": ""})
        except OSError as e:
            emit({"i": i, "ok": False, "status": 0, "peer": None,
                  "ms": (time.perf_counter() - t0) * 1e3, "connect_ms": None, "err": repr(e)})
        finally:
            conn.close()


NODE_JS = r"""
const http = require('http');
const u = new URL(process.argv[1]);
const count = +process.argv[2];
function one(i) {
  return new Promise((resolve) => {
    const t0 = process.hrtime.bigint();
    let tc = null;
    const ms = (t) => Number(t - t0) / 1e6;
    // agent: false: a new connection (and lookup) each time; Node 20's autoSelectFamily
    // (on by default) tries the lookup's addresses in turn.
    const req = http.get({ host: u.hostname, port: u.port, path: u.pathname, agent: false,
                           timeout: 5000 }, (res) => {
      const peer = res.socket.remoteAddress;
      res.resume();
      res.on('end', () => {
        const t1 = process.hrtime.bigint();
        resolve({ i, ok: res.statusCode === 200, status: res.statusCode, peer,
                  ms: ms(t1), connect_ms: tc === null ? null : ms(tc), err: '' });
      });
    });
    req.on('socket', (s) => s.on('connect', () => { tc = process.hrtime.bigint(); }));
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e) => resolve({ i, ok: false, status: 0, peer: null,
                                     ms: ms(process.hrtime.bigint()), connect_ms: null,
                                     err: String(e) }));
  });
}
(async () => {
  for (let i = 0; i < count; i++) process.stdout.write(JSON.stringify(await one(i)) + '\n');
})();
"""


def run_node(url, count):
    p = subprocess.run(["node", "-e", NODE_JS, url, str(count)])
    sys.exit(p.returncode)


def find_chromium():
    env = os.environ.get("COMBD_CHROMIUM")
    if env:
        return env
    if os.path.isfile("/usr/lib/chromium/chromium"):
        return "/usr/lib/chromium/chromium"  # Debian's binary without its wrapper's flags
    for n in ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome"):
        p = shutil.which(n)
        if p:
            return p
    return None


class Cdp:
    """The DevTools protocol over --remote-debugging-pipe (fd 3 in, fd 4 out, NUL-framed)."""

    def __init__(self, bin_path, extra_flags):
        self.profile = tempfile.mkdtemp(prefix="combd-netns-chromium-")
        to_r, to_w = os.pipe()    # we write, Chromium reads on its fd 3
        from_r, from_w = os.pipe()  # Chromium writes on its fd 4, we read
        args = [bin_path, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-background-networking", "--disable-component-update",
                "--disable-default-apps", "--disable-extensions", "--disable-sync",
                "--disable-domain-reliability", "--disable-client-side-phishing-detection",
                "--disable-breakpad", "--no-pings", "--metrics-recording-only",
                "--password-store=basic", "--use-mock-keychain", "--no-proxy-server",
                "--remote-debugging-pipe", f"--user-data-dir={self.profile}"] + extra_flags
        args.append("about:blank")

        def fds():
            # Past every low descriptor first, so neither dup2 overwrites the other's source.
            a = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(args, preexec_fn=fds, close_fds=False,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self.w = to_w
        self.r = from_r
        self.buf = b""
        self.next_id = 0
        self.events = []

    def _read_msg(self, deadline):
        import select
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("DevTools")
            rd, _, _ = select.select([self.r], [], [], left)
            if rd:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise EOFError("Chromium closed its DevTools pipe")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=None, timeout=20):
        self.next_id += 1
        m = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            m["sessionId"] = session
        os.write(self.w, json.dumps(m).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            v = self._read_msg(deadline)
            if v.get("id") == self.next_id:
                if "error" in v:
                    raise RuntimeError(f"{method}: {v['error']}")
                return v.get("result", {})
            if "method" in v:
                self.events.append(v)

    def event(self, pred, timeout):
        deadline = time.monotonic() + timeout
        while True:
            for k, v in enumerate(self.events):
                if pred(v):
                    return self.events.pop(k)
            self.events.append(self._read_msg(deadline))

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def run_chromium(url, count, extra_flags):
    b = find_chromium()
    if not b:
        print("no Chromium found", file=sys.stderr)
        sys.exit(3)
    cdp = Cdp(b, extra_flags)
    try:
        for i in range(count):
            # A fresh browser context per request: its own socket pool and host cache, so
            # every request is a new lookup and a new connection.
            ctx = cdp.call("Target.createBrowserContext", {"disposeOnDetach": True})
            bc = ctx["browserContextId"]
            t = cdp.call("Target.createTarget", {"url": "about:blank", "browserContextId": bc})
            s = cdp.call("Target.attachToTarget", {"targetId": t["targetId"], "flatten": True})
            sid = s["sessionId"]
            cdp.call("Network.enable", {}, sid)
            cdp.events.clear()
            t0 = time.perf_counter()
            nav = cdp.call("Page.navigate", {"url": url}, sid)
            rec = {"i": i, "ok": False, "status": 0, "peer": None, "ms": None,
                   "connect_ms": None, "err": nav.get("errorText", "")}
            if not nav.get("errorText"):
                try:
                    ev = cdp.event(lambda v: v.get("sessionId") == sid and v.get("method") in (
                        "Network.responseReceived", "Network.loadingFailed") and (
                        v["method"] == "Network.loadingFailed"
                        or v["params"].get("type") == "Document"), TIMEOUT)
                    if ev["method"] == "Network.responseReceived":
                        r = ev["params"]["response"]
                        tm = r.get("timing") or {}
                        rec.update(
                            ok=r["status"] == 200, status=r["status"],
                            peer=r.get("remoteIPAddress"),
                            # request start (lookup included) to the response's head
                            ms=tm.get("receiveHeadersEnd"),
                            connect_ms=(tm["connectEnd"] - tm["connectStart"])
                            if tm.get("connectStart", -1) >= 0 else None,
                            # no connect phase: a connection already open was used
                            reused=r.get("connectionReused", tm.get("connectStart", -1) < 0),
                            wall_ms=(time.perf_counter() - t0) * 1e3)
                    else:
                        rec["err"] = ev["params"].get("errorText", "loadingFailed")
                except TimeoutError:
                    rec["err"] = "timeout"
            emit(rec)
            cdp.call("Target.disposeBrowserContext", {"browserContextId": bc})
    finally:
        cdp.close()


def main():
    kind, url, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    extra = sys.argv[4:]
    if kind == "curl":
        run_curl(url, count, extra)
    elif kind == "python":
        run_python(url, count)
    elif kind == "node":
        run_node(url, count)
    elif kind == "chromium":
        run_chromium(url, count, extra)
    else:
        sys.exit(f"unknown client {kind}")


if __name__ == "__main__":
    main()
