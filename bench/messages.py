#!/usr/bin/env python3
"""bench/messages.sh's client: CONNS threads, each on its own keep-alive connection, post
transfers of 1 between random accounts for SECONDS; then it waits until every message was
taken (`alarm_objects` 0), checks the sum over the accounts, and writes what it saw to OUT:
messages taken a second (over the posting and the settling), transfers answered, and the
node's CPU while it worked."""
import argparse
import http.client
import json
import os
import random
import threading
import time


def stats(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/stats")
    return json.loads(c.getresponse().read())


def node_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--conns", type=int, default=16)
    p.add_argument("--accounts", type=int, default=64)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    names = [f"acct{i}" for i in range(a.accounts)]
    answered = [0] * a.conns
    stop = time.time() + a.seconds

    def client(k):
        rng = random.Random(k)
        c = http.client.HTTPConnection("127.0.0.2", a.port, timeout=30)
        while time.time() < stop:
            src = rng.randrange(a.accounts)
            dst = (src + 1 + rng.randrange(a.accounts - 1)) % a.accounts
            c.request("POST", f"/o/bank/{names[src]}?to={names[dst]}&amount=1", b"")
            r = c.getresponse()
            r.read()
            answered[k] += r.status == 200

    pid = stats(a.port)["pid"]
    cpu0, t0 = node_cpu_s(pid), time.time()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while stats(a.port)["alarm_objects"] != 0 and time.time() < stop + 120:
        time.sleep(0.05)
    cpu1, t1 = node_cpu_s(pid), time.time()
    s = stats(a.port)
    total = 0
    c = http.client.HTTPConnection("127.0.0.2", a.port, timeout=30)
    for n in names:
        c.request("GET", f"/o/bank/{n}")
        total += json.loads(c.getresponse().read())["balance"]
    out = {
        "seconds": a.seconds, "conns": a.conns, "accounts": a.accounts,
        "transfers_answered": sum(answered),
        "messages_taken": s["object_messages_taken"],
        "messages_taken_again": s["object_messages_taken_again"],
        "messages_sent": s["object_messages_sent"],
        "wall_s": round(t1 - t0, 2),
        "messages_taken_per_s": round(s["object_messages_taken"] / (t1 - t0)),
        "node_cpu_percent": round(100 * (cpu1 - cpu0) / (t1 - t0), 1),
        "sum": total, "sum_expected": 1000 * a.accounts,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
