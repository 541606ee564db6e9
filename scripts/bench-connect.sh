#!/usr/bin/env bash
# `jurystream connect` under load (issue 32): POST /v1/votes with NDJSON
# batches of 1000 votes (votes/s), one-vote requests and Label Studio
# webhooks (latency p50/p99), on loopback against the test broker
# (scripts/bench_connect.py is the client). The input topic is created by a
# short `jurystream run` first; connect then runs alone.
#   scripts/bench-connect.sh              ROUNDS (default 3) rounds
# JURYSTREAM_BIN=PATH measures that binary instead of the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${ROUNDS:-3}"
PORT="${BENCH_PORT:-19292}"
HTTP_PORT="${BENCH_HTTP_PORT:-19465}"
WORK="${BENCH_DIR:-${TMPDIR:-/tmp}/jurystream-bench}/connect"
TARGET="${CARGO_TARGET_DIR:-target}"
[ -n "${JURYSTREAM_BIN:-}" ] || cargo build --release --locked --bins
BIN="${JURYSTREAM_BIN:-$TARGET/release/jurystream}"
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
    scripts/broker.sh stop "$PORT" >/dev/null 2>&1 || true
}
trap cleanup EXIT
scripts/broker.sh stop "$PORT" >/dev/null 2>&1 || true
scripts/broker.sh start "$PORT" >/dev/null

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

for r in $(seq 1 "$ROUNDS"); do
    "$BIN" connect --config "$WORK/connect.toml" 2> "$WORK/connect-$r.log" &
    C=$!
    PIDS+=("$C")
    wait_ready "http://127.0.0.1:$HTTP_PORT"
    python3 scripts/bench_connect.py "http://127.0.0.1:$HTTP_PORT" bench \
        tests/fixtures/label-studio/004_ANNOTATION_UPDATED.json | tee "$WORK/round-$r.json"
    kill -TERM "$C"; wait "$C" 2>/dev/null || true
done
