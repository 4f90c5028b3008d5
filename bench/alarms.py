#!/usr/bin/env python3
"""bench/alarms.sh's two halves.

`set`: sets RATE x SECONDS alarms on OBJECTS objects of the `alarmer` test app, due from 5 s
after the last is set, RATE a second (object i's alarms every OBJECTS/RATE s, the objects
interleaved); waits until the node says all fired (`alarms_fired`), sampling the node's CPU
time meanwhile; writes what it saw to OUT.

`read`: once the node stopped, reads each object's database (the `fired` table: how late each
alarm fired, and how many times), adds the lateness percentiles and the count of alarms fired
other than once to OUT, and prints it.
"""
import argparse
import http.client
import json
import os
import sqlite3
import time


def stats(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/stats")
    return json.loads(c.getresponse().read())


def node_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def set_alarms(a):
    total = a.rate * a.seconds
    each = total // a.objects
    step_ms = a.objects * 1000 / a.rate
    c = http.client.HTTPConnection("127.0.0.2", a.port, timeout=60)
    # Setting takes a while: the first alarm is due 5 s after the setting is estimated to end.
    start_ms = int(time.time() * 1000) + 5000 + a.objects * 20
    for i in range(a.objects):
        offset = i * step_ms / a.objects
        in_ms = int(start_ms + offset - time.time() * 1000)
        if in_ms < 1000:
            raise SystemExit("setting the alarms took past their time: raise the lead")
        c.request("POST", f"/o/alarmer/b{i}?n={each}&in_ms={in_ms}&step_ms={int(step_ms)}", b"")
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise SystemExit(f"setting on b{i}: {r.status} {body[:200]!r}")
    pid = stats(a.port)["pid"]
    wait_s = (start_ms - time.time() * 1000) / 1000
    time.sleep(max(0.0, wait_s))
    cpu0, t0 = node_cpu_s(pid), time.time()
    deadline = t0 + a.seconds * 3 + 60
    while True:
        s = stats(a.port)
        if s["alarms_fired"] >= each * a.objects or time.time() > deadline:
            break
        time.sleep(0.2)
    cpu1, t1 = node_cpu_s(pid), time.time()
    out = {
        "rate": a.rate, "seconds": a.seconds, "objects": a.objects, "alarms": each * a.objects,
        "fired": s["alarms_fired"], "failed": s["alarms_failed"],
        "alarm_late_ms_max_stat": s["alarm_late_ms_max"], "wakes": s["alarm_wakes"],
        "firing_wall_s": round(t1 - t0, 2),
        "node_cpu_percent_while_firing": round(100 * (cpu1 - cpu0) / (t1 - t0), 1),
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)


def read_fired(a):
    late, other_than_once = [], 0
    objects = os.path.join(a.data, "objects", "alarmer")
    for name in sorted(os.listdir(objects)):
        if not name.endswith(".sqlite"):
            continue
        db = sqlite3.connect(os.path.join(objects, name))
        for lm, fires in db.execute("SELECT late_ms, fires FROM fired"):
            late.append(lm)
            other_than_once += fires != 1
        db.close()
    late.sort()
    pick = lambda q: late[min(len(late) - 1, round((len(late) - 1) * q))] if late else None
    with open(a.out) as f:
        out = json.load(f)
    out.update({
        "late_ms_p50": pick(0.5), "late_ms_p99": pick(0.99), "late_ms_max": late[-1] if late else None,
        "fired_in_databases": len(late), "fired_other_than_once": other_than_once,
    })
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["set", "read"])
    p.add_argument("--port", type=int)
    p.add_argument("--rate", type=int)
    p.add_argument("--seconds", type=int)
    p.add_argument("--objects", type=int)
    p.add_argument("--data")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    set_alarms(a) if a.what == "set" else read_fired(a)


if __name__ == "__main__":
    main()
