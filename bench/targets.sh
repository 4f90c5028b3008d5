# What bench/run and bench/board-ceiling.sh share: starting a target on the emulated droplet
# (tools/droplet: CPU 0, a 1 GiB memory cgroup) and stopping it. Sourced, with the repository's
# root as the working directory; sets $port, $work (removed on exit), $target_pid.
port=18100
work=$(mktemp -d)
target_pid=""
cleanup() {
  [ -n "${wrapper:-}" ] && kill -TERM "$wrapper" 2>/dev/null && wait "$wrapper" 2>/dev/null
  [ -n "$target_pid" ] && kill -TERM "$target_pid" 2>/dev/null
  true
}
trap 'cleanup; rm -rf "$work"' EXIT

wait_for() { # file pattern
  for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "bench: timed out waiting for $2 in $1" >&2; cat "$1" >&2; exit 1
}

start_target() { # combd | base | nginx | ws | uws   (base: combd built from another commit, $BASE_BIN)
  rm -rf "$work/data" && mkdir -p "$work/data"
  case "$1" in
    combd|base)
      local bin=${NODE_BIN:-target/release/combd}
      [ "$1" = base ] && bin=${BASE_BIN:?"set BASE_BIN to the other build of combd"}
      env COMBD_LISTEN=0.0.0.0:$port COMBD_DATA=$work/data COMBD_LOG=warn ${NODE_EXTRA:-} \
        tools/droplet --cpu 0 --memory 1G -- "$bin" > "$work/out" 2>&1 &
      wrapper=$!
      wait_for "$work/out" "combd ready"
      target_pid=$("$bin" top --once --json --port $port | grep -o '"pid":[0-9]*' | cut -d: -f2) ;;
    nginx)
      cat > "$work/nginx.conf" <<CONF
worker_processes 1;
daemon off;
master_process off;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 20000; }
http {
  access_log off;
  keepalive_requests 100000000;
  server {
    listen 0.0.0.0:$port reuseport;
    location = /healthz { default_type application/json; return 200 '{"status":"ok"}'; }
  }
}
CONF
      tools/droplet --cpu 0 --memory 1G -- nginx -c "$work/nginx.conf" > "$work/out" 2>&1 &
      wrapper=$!
      for _ in $(seq 200); do [ -s "$work/nginx.pid" ] && break; sleep 0.05; done
      target_pid=$(cat "$work/nginx.pid") ;;
    ws|uws)
      PORT=$port tools/droplet --cpu 0 --memory 1G -- node "bench/peers/$1-million/server.js" > "$work/out" 2>&1 &
      wrapper=$!
      wait_for "$work/out" "peer ready"
      target_pid=$(grep -o 'pid=[0-9]*' "$work/out" | cut -d= -f2) ;;
  esac
  sleep 1
}

stop_target() {
  kill -TERM "$wrapper" 2>/dev/null || true
  wait "$wrapper" 2>/dev/null || true
  wrapper=""; target_pid=""
}


# Runs `combd-bench SCENARIO ARGS...` on CPU 1 against WHO, started for it and stopped after:
# its JSON to OUT, what it prints on stderr appended to LOG.
measure() { # who out log scenario args...
  local who=$1 out=$2 log=$3 scenario=$4; shift 4
  start_target "$who"
  taskset -c 1 target/release/combd-bench "$scenario" --port $port --pid "$target_pid" \
    --out "$out" "$@" > /dev/null 2>> "$log"
  stop_target
}
