#!/usr/bin/env python3
"""A timeline of a running node: every INTERVAL (default 0.1 s) one line of its own counters
(/stats on 127.0.0.1:PORT), its CPU, its threads' states and its memory cgroup's memory.stat.

Usage: tools/timeline.py PORT SECONDS [INTERVAL] > timeline.tsv

Columns: t (s), node CPU % of a core over the interval, threads in D (waiting on the disk),
then the /stats deltas (counters) or values (gauges) named below, then the cgroup's dirty,
writeback and page-cache bytes (MiB), its memory usage (MiB), and the whole machine's iowait
and steal (% of all its CPUs: steal is time the hypervisor ran something else). Made to find what a node is
waiting for when it is neither busy nor refusing for want of CPU (issue 14, item 4)."""
import json, os, sys, time, urllib.request

COUNTERS = ["batches", "wal_syncs", "mailbox_refused", "ws_messages_in", "ws_messages_out",
            "ws_sends", "turn_yields", "turn_overruns"]
GAUGES = ["mailbox_oldest_age_ms", "lag_ms", "fanouts_in_progress", "outbound_bytes",
          "cells_awake", "sync_group_max", "batch_max", "wal_sync_max_us", "wal_syncs_slow"]


def stats(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=2) as r:
        return json.load(r)


def cgroup_dir(pid):
    for line in open(f"/proc/{pid}/cgroup"):
        _, ctrl, path = line.rstrip("\n").split(":", 2)
        if ctrl == "":  # v2
            d = "/sys/fs/cgroup/unified" + path
            if os.path.exists(d + "/memory.stat"):
                return d, 2
        if "memory" in ctrl.split(","):
            return "/sys/fs/cgroup/memory" + path, 1
    return None, 0


def memstat(d, v):
    if not d:
        return {}
    m = {}
    try:
        for line in open(d + "/memory.stat"):
            k, val = line.split()
            m[k] = int(val)
        usage = "memory.usage_in_bytes" if v == 1 else "memory.current"
        m["usage"] = int(open(f"{d}/{usage}").read())
    except OSError:
        pass
    return m


def cpu_ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def threads_in_d(pid):
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            if open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0] == "D":
                n += 1
        except OSError:
            pass
    return n


def host_cpu():
    """(iowait, steal) jiffies of the whole machine."""
    f = open("/proc/stat").readline().split()
    return int(f[5]), int(f[8])


def main():
    port, secs = int(sys.argv[1]), float(sys.argv[2])
    step = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    s0 = stats(port)
    pid = s0["pid"]
    d, v = cgroup_dir(pid)
    hz = os.sysconf("SC_CLK_TCK")
    mib = lambda b: round(b / 2**20, 1)
    print("\t".join(["t", "cpu%", "D"] + COUNTERS + GAUGES +
                    ["dirty_mib", "writeback_mib", "cache_mib", "usage_mib", "iowait%", "steal%"]))
    start = time.monotonic()
    prev, prev_ticks, prev_t, prev_host = s0, cpu_ticks(pid), start, host_cpu()
    while time.monotonic() - start < secs:
        time.sleep(step)
        now = time.monotonic()
        try:
            s, ticks = stats(port), cpu_ticks(pid)
        except Exception:
            break
        m = memstat(d, v)
        host = host_cpu()
        cpu = (ticks - prev_ticks) / hz / (now - prev_t) * 100
        row = [f"{now - start:.2f}", f"{cpu:.0f}", str(threads_in_d(pid))]
        row += [str(s.get(k, 0) - prev.get(k, 0)) for k in COUNTERS]
        row += [str(s.get(k, "")) for k in GAUGES]
        dirty = m.get("dirty", m.get("file_dirty", 0))
        wb = m.get("writeback", m.get("file_writeback", 0))
        cache = m.get("cache", m.get("file", 0))
        row += [str(mib(dirty)), str(mib(wb)), str(mib(cache)), str(mib(m.get("usage", 0)))]
        span = hz * (now - prev_t) * os.cpu_count()
        row += [f"{(host[0] - prev_host[0]) / span * 100:.0f}", f"{(host[1] - prev_host[1]) / span * 100:.0f}"]
        print("\t".join(row), flush=True)
        prev, prev_ticks, prev_t, prev_host = s, ticks, now, host


if __name__ == "__main__":
    main()
