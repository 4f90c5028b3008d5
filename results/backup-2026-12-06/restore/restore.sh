#!/usr/bin/env bash
# A 100 MiB object restored from a local backup directory: the time `combd restore` takes.
cd "$(dirname "$0")/../../.."
port=18084; data=$(mktemp -d); bk=$(mktemp -d)
env COMBD_LISTEN=127.0.0.2:$port COMBD_DATA=$data COMBD_LOG=warn COMBD_BACKUP=$bk \
  target/release/combd-test-node > "$data/stdout" 2>&1 &
node=$!
for _ in $(seq 100); do grep -q "combd ready" "$data/stdout" 2>/dev/null && break; sleep 0.1; done
python3 - $port <<'PY'
import sys, http.client, time
port = int(sys.argv[1]); value = 'x' * 65536
c = http.client.HTTPConnection('127.0.0.2', port)
t = time.time()
for i in range(1600):
    c.request('POST', '/o/kv/big', body=f'k{i}={value}'); r = c.getresponse(); r.read()
    assert r.status == 200, r.status
print(f'wrote 1600 x 64 KiB in {time.time()-t:.1f} s')
PY
sleep 2
curl -s -XPOST "127.0.0.1:$port/objects/kv/big/sql" -d 'SELECT count(*) FROM kv' ; echo
ls -la $data/objects/kv/ $bk/objects/kv/big/
for at in latest 800; do
  s=$(date +%s.%N); target/release/combd restore kv/big --at $at --as copy-$at --port $port; e=$(date +%s.%N)
  echo "restore --at $at: $(echo "$e - $s" | bc) s"
done
curl -s -XPOST "127.0.0.1:$port/objects/kv/copy-latest/sql" -d 'SELECT count(*) FROM kv'; echo
curl -s -XPOST "127.0.0.1:$port/objects/kv/copy-800/sql" -d 'SELECT count(*) FROM kv'; echo
kill -TERM $node; wait $node; rm -rf "$data" $bk
