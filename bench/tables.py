#!/usr/bin/env python3
"""The side-by-side tables of one `bench/run`: reads DIR/<scenario>-<target>.json (bench/out by
default) and prints markdown. `bench/run` writes its output to bench/out/tables.md; run it on a
copy of an earlier run's directory to print that run's tables again."""
import json, os, sys
out = sys.argv[1] if len(sys.argv) > 1 else "bench/out"
def load(n):
    f = f"{out}/{n}.json"
    return json.load(open(f)) if os.path.exists(f) else None
def num(v, fmt):
    return fmt.format(v) if v is not None else "–"
def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "–"
def gen(r):
    """The generator's CPU, marked ⚠ above 90 % of its core (it may be the ceiling there); "–"
    where the scenario does not measure it (idle)."""
    g = r.get('generator_cpu_percent')
    if g is None:
        return "–"
    return f"{g:.1f}" + (" ⚠" if g > 90 else "")
def table(title, runs, rows):
    """runs: [(label, result)], the first combd, the second the peer the ratio is against."""
    runs = [(l, r) for l, r in runs if r is not None]
    if not runs or runs[0][0] != "combd":
        return
    peer = runs[1][0] if len(runs) > 1 else None
    print(f"\n### {title}\n")
    print("| figure | " + " | ".join(l for l, _ in runs) + (f" | combd / {peer} |" if peer else " |"))
    print("|---" * (len(runs) + 1 + (1 if peer else 0)) + "|")
    for label, key, fmt, scale in rows:
        vals = [r.get(key) for _, r in runs]
        vals = [v / scale if isinstance(v, (int, float)) and scale != 1 else v for v in vals]
        cells = [num(v, fmt) for v in vals]
        print(f"| {label} | " + " | ".join(cells) + (f" | {ratio(vals[0], vals[1])} |" if peer else " |"))
    print("| generator CPU (%; ⚠ above 90 %: it may be the ceiling) | " + " | ".join(gen(r) for _, r in runs) + (" | |" if peer else " |"))
table("http: keep-alive GET /healthz, 64 connections, 20 s",
      [("combd", load("http-combd")), ("nginx", load("http-nginx"))],
      [("requests per second", "requests_per_second", "{:,.0f}", 1), ("latency p50 (ms)", "latency_p50_ms", "{:.3f}", 1),
       ("latency p99 (ms)", "latency_p99_ms", "{:.3f}", 1), ("server CPU (% of its core)", "target_cpu_percent", "{:.1f}", 1)])
peers = [("uWS", "uws"), ("Node.js + ws", "ws")]
table("idle: 10,000 million viewers held idle",
      [("combd", load("idle-combd"))] + [(l, load(f"idle-{k}")) for l, k in peers],
      [("user-space bytes per connection", "node_user_bytes_per_conn", "{:,.0f}", 1), ("ping p50 (ms)", "ping_p50_ms", "{:.3f}", 1),
       ("ping p99 (ms)", "ping_p99_ms", "{:.3f}", 1)])
for name, title in [("click", "click: 5,000 viewers, a click every 10 s each, 30 s"),
                    ("click-10k", "click: 10,000 viewers, a click every 10 s each, 30 s"),
                    ("click-heavy", "click (heavy): 2,000 viewers, a click every 1 s each, 30 s"),
                    ("click-4k", "click (heavy): 4,000 viewers, a click every 0.4 s each (10,000 clicks/s on one board), 30 s")]:
    table(title, [("combd", load(f"{name}-combd"))] + [(l, load(f"{name}-{k}")) for l, k in peers],
          [("clicks sent", "clicks_sent", "{:,.0f}", 1), ("lost %", "lost_percent", "{:.3f}", 1),
           ("echo p50 (ms)", "echo_p50_ms", "{:.2f}", 1), ("echo p99 (ms)", "echo_p99_ms", "{:.2f}", 1),
           ("server CPU (% of its core)", "node_cpu_percent", "{:.1f}", 1), ("server memory (MB)", "node_rss_bytes", "{:.1f}", 1e6)])
o_c, o_w = load("overload-combd"), load("overload-ws")
if o_c and o_w:
    print("\n### overload: 8,000 clicking viewers against a node that holds 4,000 (COMBD_MAX_CONNS=4000; the ws server has no limit)\n")
    print("| figure | combd | Node.js + ws |\n|---|---|---|")
    for label, key, fmt in [("viewers served", "viewers", "{:,}"), ("refused at TCP", "viewers_refused_at_tcp", "{:,}"), ("answered 503", "viewers_answered_503", "{:,}"),
                            ("closed otherwise", "viewers_closed_otherwise", "{:,}"), ("served viewers' lost clicks %", "lost_percent", "{:.2f}"),
                            ("served viewers' echo p50 (ms)", "echo_p50_ms", "{:.2f}"), ("served viewers' echo p99 (ms)", "echo_p99_ms", "{:.2f}"),
                            ("server memory (MB)", "node_rss_bytes", None), ("alive afterwards", "node_alive_after", "{}")]:
        a, b = o_c[key], o_w[key]
        if fmt is None:
            a, b, fmt = a / 1e6, b / 1e6, "{:.1f}"
        print(f"| {label} | {fmt.format(a)} | {fmt.format(b)} |")
