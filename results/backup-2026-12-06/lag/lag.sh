#!/usr/bin/env bash
# 10,000 durable clicks a second with COMBD_BACKUP on: the lag (max and p99) from /stats each second and at the end.
cd "$(dirname "$0")/../../.."
port=18083; data=$(mktemp -d); bk=$(mktemp -d)
env COMBD_LISTEN=0.0.0.0:$port COMBD_DATA=$data COMBD_LOG=warn COMBD_BACKUP=$bk \
  tools/droplet --cpu 0 --memory 1G -- target/release/combd > "$data/stdout" &
node=$!
for _ in $(seq 100); do grep -q "combd ready" "$data/stdout" 2>/dev/null && break; sleep 0.1; done
sleep 2
( for _ in $(seq 40); do curl -s 127.0.0.1:$port/stats | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["backup_behind_ms"], s["backup_queued_bytes"], s["backup_lag_max_ms"], s["backup_lag_p99_ms"], s["backup_segments"])'; sleep 1; done ) > bench/out/backup-lag2-samples.txt &
taskset -c 1 target/release/combd-bench click --port $port --out bench/out/backup-lag2-10k.json --conns 10000 --interval-ms 1000 --duration-s 30 --board lag
curl -s 127.0.0.1:$port/stats | python3 -c 'import json,sys; s=json.load(sys.stdin); print({k:v for k,v in s.items() if k.startswith("backup")})'
kill -TERM $node; wait $node; du -sh $bk; rm -rf "$data" $bk
