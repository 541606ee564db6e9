#!/usr/bin/env bash
# `jurystream connect` under load: POST /v1/votes with NDJSON
# batches of 1000 votes (votes/s), one-vote requests and Label Studio
# webhooks (latency p50/p99), on loopback against the test broker
# (scripts/bench_connect.py is the client). The input topic is created by a
# short `jurystream run` first; connect then runs alone, and then (when
# haproxy is installed) two instances behind haproxy.
#   scripts/bench-connect.sh              ROUNDS (default 3) rounds
# JURYSTREAM_BIN=PATH measures that binary instead of the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ROUNDS="${ROUNDS:-3}"
PORT="${BENCH_PORT:-19292}"
HTTP_PORT="${BENCH_HTTP_PORT:-19465}"
WORK="${BENCH_DIR:-${TMPDIR:-/tmp}/jurystream-bench}/connect"
release_bin
mkdir -p "$WORK"
rm -rf "$WORK/state"
cat > "$WORK/connect.toml" <<TOML
[kafka]
brokers = "127.0.0.1:$PORT"
group_id = "bench-connect"
input_topics = ["bench-connect-votes"]
delivery = "at_least_once"
[state]
dir = "$WORK/state"
[metrics]
listen = "127.0.0.1:0"
[connect]
listen = "127.0.0.1:$HTTP_PORT"
token = "bench"
TOML

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    broker_stop "$PORT"
}
trap cleanup EXIT
broker_restart "$PORT" >/dev/null

wait_ready() { # url
    for _ in $(seq 1 300); do
        curl -sf "$1/readyz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "not ready: $1" >&2
    return 1
}

# Topics: `run` creates them at start.
RUN_HTTP="127.0.0.1:$((HTTP_PORT + 1))"
JURYSTREAM_METRICS__LISTEN="$RUN_HTTP" "$BIN" run --config "$WORK/connect.toml" 2> "$WORK/run.log" &
RUN=$!
PIDS+=("$RUN")
wait_ready "http://$RUN_HTTP"
kill -TERM "$RUN"; wait "$RUN" 2>/dev/null || true

# Through a load balancer too: Debian's haproxy in front of two
# connect instances (health check on /readyz), as deploy/k8s runs the
# webhook; skipped when haproxy is not installed.
LB_PORT=$((HTTP_PORT + 3))
cat > "$WORK/haproxy.cfg" <<CFG
global
  maxconn 256
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
frontend votes
  bind 127.0.0.1:$LB_PORT
  default_backend connect
backend connect
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter 1000 fall 2 rise 1
  server c1 127.0.0.1:$HTTP_PORT check
  server c2 127.0.0.1:$((HTTP_PORT + 2)) check
CFG

bench() { # url label
    python3 scripts/bench_connect.py "$1" bench \
        tests/fixtures/label-studio/004_ANNOTATION_UPDATED.json | tee "$WORK/round-$2.json"
}

for r in $(seq 1 "$ROUNDS"); do
    "$BIN" connect --config "$WORK/connect.toml" 2> "$WORK/connect-$r.log" &
    C=$!
    PIDS+=("$C")
    wait_ready "http://127.0.0.1:$HTTP_PORT"
    echo "round $r: direct"
    bench "http://127.0.0.1:$HTTP_PORT" "$r"
    if command -v haproxy >/dev/null 2>&1; then
        JURYSTREAM_CONNECT__LISTEN="127.0.0.1:$((HTTP_PORT + 2))" \
            "$BIN" connect --config "$WORK/connect.toml" 2> "$WORK/connect-$r-b.log" &
        C2=$!
        haproxy -db -f "$WORK/haproxy.cfg" 2> "$WORK/haproxy-$r.log" &
        H=$!
        PIDS+=("$C2" "$H")
        wait_ready "http://127.0.0.1:$((HTTP_PORT + 2))"
        wait_ready "http://127.0.0.1:$LB_PORT"
        sleep 2 # both servers up in haproxy
        echo "round $r: through haproxy, two instances"
        bench "http://127.0.0.1:$LB_PORT" "$r-lb"
        kill -TERM "$H" "$C2"; wait "$H" "$C2" 2>/dev/null || true
    fi
    kill -TERM "$C"; wait "$C" 2>/dev/null || true
done
