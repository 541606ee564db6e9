#!/usr/bin/env bash
# End-to-end Kafka benchmark (issue #3): N votes preloaded on a 4-partition
# topic of the test broker; measures `jurystream run` from start until every
# input offset is committed, against a passthrough (consume -> produce ->
# flush -> commit, no scoring) on the same broker in the same run.
#   scripts/bench-kafka.sh [VOTES]     (default 1000000)
# The test broker (tansu 0.6.0) has no Kafka transactions, so both sides use
# the at-least-once cycle; on Apache Kafka set DELIVERY=exactly_once.
# Also reports the commit latency (jurystream_commit_duration_seconds,
# scraped from the service's /metrics on METRICS_PORT, default 19299, just
# before it is stopped): commits, mean, and the p50 / p99 bucket bounds.
# JURYSTREAM_BIN=PATH measures that binary instead of the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000000}"
DELIVERY="${DELIVERY:-at_least_once}"
PORT="${BENCH_PORT:-19192}"
WORK="${BENCH_DIR:-${TMPDIR:-/tmp}/jurystream-bench}"
mkdir -p "$WORK"
INPUT="$WORK/votes-$N.jsonl"
[ -f "$INPUT" ] || python3 scripts/gen-votes.py --votes "$N" --out "$INPUT"
TARGET="${CARGO_TARGET_DIR:-target}"
BROKERS="127.0.0.1:$PORT"

. scripts/kafka-bench-lib.sh
[ -n "${JURYSTREAM_BIN:-}" ] || cargo build --release --locked --bins
BIN="${JURYSTREAM_BIN:-$TARGET/release/jurystream}"
HELPER="$(bench_exe kafka_passthrough)"

scripts/broker.sh stop "$PORT" >/dev/null 2>&1 || true
scripts/broker.sh start "$PORT"
trap 'scripts/broker.sh stop "$PORT" >/dev/null 2>&1 || true' EXIT
RUN="bench$$"
METRICS="127.0.0.1:${METRICS_PORT:-19299}"
service_config "$RUN" "$RUN-group" "$WORK/state-$RUN" "$METRICS" "$DELIVERY" "$BROKERS" > "$WORK/kafka.toml"
rm -rf "$WORK/state-$RUN"
preload "$BIN" "$RUN" "$INPUT" "$DELIVERY" "$BROKERS" "$WORK"
TOTAL="$(grep -cv '^[[:space:]]*$' "$INPUT")"

# 1. passthrough baseline
PASS_S="$("$HELPER" pass "$BROKERS" "$RUN-votes" "$RUN-pass-out" "$RUN-pass" "$TOTAL")"
# 2. jurystream run
START=$(date +%s.%N)
"$BIN" run --config "$WORK/kafka.toml" > "$WORK/run.log" 2>&1 &
PID=$!
"$HELPER" wait "$BROKERS" "$RUN-votes" "$RUN-group" "$TOTAL" > /dev/null
END=$(date +%s.%N)
curl -sf "http://$METRICS/metrics" > "$WORK/run-metrics.txt" || : > "$WORK/run-metrics.txt"
kill -TERM $PID; wait $PID || true
python3 - "$TOTAL" "$PASS_S" "$START" "$END" "$WORK/run-metrics.txt" <<'PY'
import re, sys
n = int(sys.argv[1]); p = float(sys.argv[2]); r = float(sys.argv[4]) - float(sys.argv[3])
print(f"passthrough: {p:.2f} s = {n/p:,.0f} votes/s")
print(f"jurystream run: {r:.2f} s = {n/r:,.0f} votes/s")
print(f"ratio run / passthrough throughput: {p/r:.2f}")
name = "jurystream_commit_duration_seconds"
buckets, total, count = [], 0.0, 0
for line in open(sys.argv[5]):
    m = re.match(name + r'_bucket\{le="([^"]+)"\} (\S+)', line)
    if m:
        buckets.append((float(m.group(1)), float(m.group(2))))
    elif line.startswith(name + "_sum "):
        total = float(line.split()[1])
    elif line.startswith(name + "_count "):
        count = int(float(line.split()[1]))
def bound(q):
    for le, c in buckets:
        if c >= q * count:
            return "+Inf" if le == float("inf") else f"{le * 1000:g} ms"
if count:
    print(f"commit latency: {count} commits, mean {total / count * 1000:.1f} ms, "
          f"p50 <= {bound(0.5)}, p99 <= {bound(0.99)} (histogram bucket bounds)")
else:
    print("commit latency: not scraped (no /metrics answer)")
PY
