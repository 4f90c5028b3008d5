#!/usr/bin/env python3
"""A tiny authoritative DNS server (UDP, stdlib only) for the fleet-by-refusal measurements.

Answers one name with several A records, in an order it is told, TTL 0 (so a client's cache
never stands in for a lookup); every other name is NXDOMAIN; AAAA and every other type of the
name is an empty NOERROR. It logs each A answer's order, so a run can count the lookups in
which the refusing node came first.

    dns.py --listen 198.18.0.1 --name fleet.combd.test --addrs A,B,C --mode-file F --log L

The order is read from --mode-file at each query (so one server serves every phase):
  fixed          the addresses as given
  first:IP       IP first, the others after it in turn (rotating)
  rotate         round robin (each A answer starts one further)
  random:SEED    a shuffle per answer from a seeded generator
Why our own and not dnsmasq: the measurement needs the order under control (the refusing node
first in every lookup for the extra time; a known share for the fleet figure) and logged.
"""
import argparse
import random
import socket
import struct
import sys
import time


def parse_question(msg):
    """(id, flags, qname lowercased, qtype, qclass, end offset of the question) or None."""
    if len(msg) < 12:
        return None
    qid, flags, qd = struct.unpack("!HHH", msg[:6])
    if qd != 1 or flags & 0x8000:
        return None
    labels, i = [], 12
    while True:
        if i >= len(msg):
            return None
        n = msg[i]
        i += 1
        if n == 0:
            break
        if n & 0xC0 or i + n > len(msg):
            return None
        labels.append(msg[i:i + n].decode("ascii", "replace").lower())
        i += n
    if i + 4 > len(msg):
        return None
    qtype, qclass = struct.unpack("!HH", msg[i:i + 4])
    return qid, flags, ".".join(labels), qtype, qclass, i + 4


def answer(msg, q, rcode, addrs):
    qid, flags, _, _, _, qend = q
    rd = flags & 0x0100
    out = struct.pack("!HHHHHH", qid, 0x8400 | rd | rcode, 1, len(addrs), 0, 0)
    out += msg[12:qend]
    for a in addrs:
        # name: pointer to the question's name (offset 12); A, IN, TTL 0, 4 bytes
        out += struct.pack("!HHHIH", 0xC00C, 1, 1, 0, 4) + socket.inet_aton(a)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--port", type=int, default=53)
    p.add_argument("--name", required=True)
    p.add_argument("--addrs", required=True)
    p.add_argument("--mode-file", required=True)
    p.add_argument("--log", required=True)
    a = p.parse_args()
    name = a.name.lower().rstrip(".")
    addrs = a.addrs.split(",")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((a.listen, a.port))
    log = open(a.log, "a", buffering=1)
    turn = 0
    rng, rng_seed = None, None
    print(f"dns ready {a.listen}:{a.port}", flush=True)
    while True:
        msg, peer = sock.recvfrom(4096)
        q = parse_question(msg)
        if q is None:
            continue
        _, _, qname, qtype, qclass, _ = q
        if qname != name:
            sock.sendto(answer(msg, q, 3, []), peer)  # NXDOMAIN
            continue
        if qtype != 1 or qclass != 1:
            sock.sendto(answer(msg, q, 0, []), peer)  # no data
            continue
        try:
            with open(a.mode_file) as f:
                mode = f.read().strip() or "fixed"
        except OSError:
            mode = "fixed"
        if mode.startswith("first:"):
            first = mode.split(":", 1)[1]
            rest = [x for x in addrs if x != first]
            k = turn % len(rest) if rest else 0
            order = [first] + rest[k:] + rest[:k]
        elif mode == "rotate":
            k = turn % len(addrs)
            order = addrs[k:] + addrs[:k]
        elif mode.startswith("random:"):
            seed = mode.split(":", 1)[1]
            if seed != rng_seed:
                rng, rng_seed = random.Random(seed), seed
            order = addrs[:]
            rng.shuffle(order)
        else:
            order = addrs[:]
        turn += 1
        sock.sendto(answer(msg, q, 0, order), peer)
        log.write(f"{time.time():.6f} {peer[0]} {mode} {','.join(order)}\n")


if __name__ == "__main__":
    sys.exit(main())
