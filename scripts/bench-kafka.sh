#!/usr/bin/env bash
# End-to-end Kafka benchmark (issue #3): N votes preloaded on a 4-partition
# topic of the test broker; measures `jurystream run` from start until every
# input offset is committed, against a passthrough (consume -> produce ->
# flush -> commit, no scoring) on the same broker in the same run.
#   scripts/bench-kafka.sh [VOTES]     (default 1000000)
# The test broker (tansu 0.6.0) has no Kafka transactions, so both sides use
# the at-least-once cycle; on Apache Kafka set DELIVERY=exactly_once.
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

cargo build --release --locked --bins
BIN="${JURYSTREAM_BIN:-$TARGET/release/jurystream}"
HELPER="$(cargo bench --locked --bench kafka_passthrough --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "kafka_passthrough" and m.get("executable"):
        print(m["executable"])')"

scripts/broker.sh stop "$PORT" >/dev/null 2>&1 || true
scripts/broker.sh start "$PORT"
trap 'scripts/broker.sh stop "$PORT" >/dev/null 2>&1 || true' EXIT
RUN="bench$$"
cat > "$WORK/kafka.toml" <<TOML
[batching]
idle_flush_seconds = 5
[outputs]
scores_topic = "$RUN-scores"
flags_topic = "$RUN-flags"
dlq_topic = "$RUN-dlq"
[metrics]
listen = "127.0.0.1:0"
[kafka]
brokers = "$BROKERS"
group_id = "$RUN-group"
input_topics = ["$RUN-votes"]
topic_partitions = 4
delivery = "$DELIVERY"
[kafka.properties]
"session.timeout.ms" = "6000"
"max.poll.interval.ms" = "6000"
[state]
dir = "$WORK/state-$RUN"
TOML
# Topics first (the service creates them), then preload the votes. The
# topic-creating start uses a group of its own: with the measured group its
# idle flush would move that group's watermark to the wall clock, and the
# measured run (restoring it) would reject every vote of the file as late.
sed -e "s/^group_id = .*/group_id = \"$RUN-setup\"/" \
    -e "s|^dir = .*|dir = \"$WORK/state-$RUN-setup\"|" "$WORK/kafka.toml" > "$WORK/kafka-setup.toml"
timeout 20 "$BIN" run --config "$WORK/kafka-setup.toml" > /dev/null 2>&1 || true
rm -rf "$WORK/state-$RUN-setup" "$WORK/state-$RUN"
"$BIN" produce --input "$INPUT" --topic "$RUN-votes" --brokers "$BROKERS"
TOTAL="$(grep -cv '^[[:space:]]*$' "$INPUT")"

# 1. passthrough baseline
PASS_S="$("$HELPER" pass "$BROKERS" "$RUN-votes" "$RUN-pass-out" "$RUN-pass" "$TOTAL")"
# 2. jurystream run
START=$(date +%s.%N)
"$BIN" run --config "$WORK/kafka.toml" > "$WORK/run.log" 2>&1 &
PID=$!
"$HELPER" wait "$BROKERS" "$RUN-votes" "$RUN-group" "$TOTAL" > /dev/null
END=$(date +%s.%N)
kill -TERM $PID; wait $PID || true
python3 - "$TOTAL" "$PASS_S" "$START" "$END" <<'PY'
import sys
n = int(sys.argv[1]); p = float(sys.argv[2]); r = float(sys.argv[4]) - float(sys.argv[3])
print(f"passthrough: {p:.2f} s = {n/p:,.0f} votes/s")
print(f"jurystream run: {r:.2f} s = {n/r:,.0f} votes/s")
print(f"ratio run / passthrough throughput: {p/r:.2f}")
PY
