#!/usr/bin/env python3
"""The table of bench/board-ceiling.sh: reads DIR/<target>-<rate>-<round>.json and prints, per
target and rate, the medians of the rounds and the ceiling (the highest rate at which it and
every rate below it had a median echo p99 of at most 100 ms and no click lost).
Usage: bench/board_ceiling.py DIR RATE...   (e.g. on results/board-ceiling-2026-12-04)"""
import json, glob, statistics, sys
dir, rates = sys.argv[1], [int(r) for r in sys.argv[2:]]
med = statistics.median
print("| target | clicks/s | echo p50 / p99 (ms) | clicks lost (the board's refusals among them) | node CPU % | generator CPU % | runs |")
print("|---|---|---|---|---|---|---|")
ceiling, above = {}, {}
for who in sorted({f.split("/")[-1].split("-")[0] for f in glob.glob(f"{dir}/*.json")}):
    ok = True
    for rate in rates:
        runs = [json.load(open(f)) for f in sorted(glob.glob(f"{dir}/{who}-{rate}-*.json"))]
        if not runs:
            continue
        p50 = med(r["echo_p50_ms"] for r in runs)
        p99 = med(r["echo_p99_ms"] for r in runs)
        # A click the board refused is never echoed: it is among the lost.
        bad = [r["clicks_lost"] for r in runs]
        cpu = med(r["node_cpu_percent"] for r in runs)
        gen = med(r["generator_cpu_percent"] for r in runs)
        sent = med(r["clicks_sent"] / r["duration_s"] for r in runs)
        ok = ok and p99 <= 100 and med(bad) == 0
        if ok:
            ceiling[who] = rate
        else:
            above.setdefault(who, rate)
        print(f"| {who} | {rate:,} ({sent:,.0f} sent) | {p50:.2f} / {p99:.1f} | {med(bad):,.0f} "
              f"({', '.join(str(b) for b in bad)}) | {cpu:.1f} | {gen:.1f}{' ⚠' if gen > 90 else ''} | {len(runs)} |")
print()
for who in sorted({f.split("/")[-1].split("-")[0] for f in glob.glob(f"{dir}/*.json")}):
    if who in ceiling and who in above:
        print(f"{who}: the board's ceiling is from {ceiling[who]:,} to below {above[who]:,} clicks a second (p99 ≤ 100 ms, none lost)")
    elif who in ceiling:
        print(f"{who}: the board's ceiling is at least {ceiling[who]:,} clicks a second, the highest rate run (p99 ≤ 100 ms, none lost)")
    else:
        print(f"{who}: below {rates[0]:,} clicks a second, the lowest rate run")
