#!/usr/bin/env bash
# Peer benchmark: jurystream against the Quix Streams app a Python
# team would write for the same job (benches/quix_peer.py: per-vote decay
# with Quix's RocksDB state and changelog), and a passthrough (consume ->
# produce -> commit, no state) for scale, in one run on the test broker.
#   scripts/bench-peer.sh [VOTES]      (default 1000000)
# N votes (scripts/gen-votes.py, keyed by inference_id) are preloaded on a
# 4-partition topic; each contender starts with a fresh consumer group and
# state and is timed from its process start until the group has committed
# every input offset. CPU = user + system time of the process until then
# (from /proc, before it is stopped). Reported: votes/s, and CPU seconds per
# million votes.
# Both run at-least-once by default (DELIVERY=at_least_once,
# QUIX_GUARANTEE=at-least-once; docs/PERFORMANCE.md's figures). The test
# broker (the prebuilt tansu of scripts/broker.sh) commits Kafka
# transactions, so DELIVERY=exactly_once QUIX_GUARANTEE=exactly-once can be
# set on it too (not measured on it), as on Apache Kafka.
# JURYSTREAM_BIN=PATH measures that binary instead of the release build.
# Quix Streams (pinned) is installed into a virtualenv under the work dir.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N="${1:-1000000}"
DELIVERY="${DELIVERY:-at_least_once}"
QUIX_GUARANTEE="${QUIX_GUARANTEE:-at-least-once}"
PORT="${BENCH_PORT:-19193}"
bench_votes "$N"
BROKERS="127.0.0.1:$PORT"

. scripts/kafka-bench-lib.sh
quix_venv
PY="$VENV/bin/python"
release_bin
HELPER="$(bench_exe kafka_passthrough)"

broker_restart "$PORT"
trap 'broker_stop "$PORT"' EXIT
RUN="peer$$"

# The votes topic is created with explicit retention settings: Quix derives
# its changelog's settings from them, and tansu 0.6.0 describes only the
# settings a topic was created with.
"$PY" - "$BROKERS" "$RUN-votes" <<'PY' 2>/dev/null
import sys
from confluent_kafka.admin import AdminClient, NewTopic
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
config = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
for fut in admin.create_topics([NewTopic(sys.argv[2], 4, 1, config=config)]).values():
    fut.result()
PY
service_config "$RUN" "$RUN-group" "$WORK/state-$RUN" 127.0.0.1:0 "$DELIVERY" "$BROKERS" > "$WORK/peer.toml"
rm -rf "$WORK/state-$RUN" "$WORK/quix-state-$RUN"
preload "$BIN" "$RUN" "$INPUT" "$DELIVERY" "$BROKERS" "$WORK"
TOTAL="$(grep -cv '^[[:space:]]*$' "$INPUT")"
TCK="$(getconf CLK_TCK)"

# measure LABEL GROUP CMD...: wall seconds from start to every offset
# committed by GROUP, and the process's CPU seconds until then.
measure() {
    local label="$1" group="$2"; shift 2
    local start end ticks pid
    start=$(date +%s.%N)
    "$@" > "$WORK/$label.log" 2>&1 &
    pid=$!
    "$HELPER" wait "$BROKERS" "$RUN-votes" "$group" "$TOTAL" > /dev/null
    end=$(date +%s.%N)
    ticks=$(awk '{print $14 + $15}' /proc/$pid/stat)
    kill -TERM $pid; wait $pid || true
    python3 -c 'import sys; s, e, t, k = map(float, sys.argv[1:5]); print(f"{e - s:.3f} {t / k:.2f}")' \
        "$start" "$end" "$ticks" "$TCK"
}

PASS_S="$("$HELPER" pass "$BROKERS" "$RUN-votes" "$RUN-pass-out" "$RUN-pass" "$TOTAL")"
read -r JS_S JS_CPU < <(measure jurystream "$RUN-group" "$BIN" run --config "$WORK/peer.toml")
read -r QX_S QX_CPU < <(measure quix "$RUN-quix" "$PY" benches/quix_peer.py "$BROKERS" \
    "$RUN-votes" "$RUN-quix-scores" "$RUN-quix" "$WORK/quix-state-$RUN" "$QUIX_GUARANTEE")
rm -rf "$WORK/state-$RUN" "$WORK/quix-state-$RUN"
python3 - "$TOTAL" "$PASS_S" "$JS_S" "$JS_CPU" "$QX_S" "$QX_CPU" "$DELIVERY" "$QUIX_GUARANTEE" <<'PY'
import sys
n = int(sys.argv[1]); p, js, jc, qs, qc = map(float, sys.argv[2:7])
print(f"{n} votes, 4 partitions; jurystream {sys.argv[7]}, Quix Streams {sys.argv[8]}")
print(f"passthrough:    {p:8.2f} s  {n / p:>9,.0f} votes/s")
print(f"jurystream run: {js:8.2f} s  {n / js:>9,.0f} votes/s  {jc:7.2f} CPU s = {jc * 1e6 / n:6.2f} CPU s per million votes")
print(f"Quix Streams:   {qs:8.2f} s  {n / qs:>9,.0f} votes/s  {qc:7.2f} CPU s = {qc * 1e6 / n:6.2f} CPU s per million votes")
print(f"jurystream / Quix throughput: {qs / js:.2f}x; CPU per vote: {jc / qc:.2f}x")
PY
