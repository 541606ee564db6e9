#!/usr/bin/env bash
# State benchmark (issue 11): memory and time of a long history kept in
# RocksDB.
#   scripts/bench-state.sh [INFERENCES]     (default 1000000; try 10000000)
# 1. generates the history (scripts/gen-history.py: INFERENCES inferences
#    over 60 days, 3 votes each, one rubric) unless it exists;
# 2. `replay --state-dir` of the whole history (time, peak RSS, state size);
# 3. continues that state with a file of one more vote (time, peak RSS);
# 4. with BROKER=1: `jurystream run` on a partition holding that state
#    (copied into its state.dir) on the test broker: time from start to
#    /readyz = 200, and its RSS then.
# JURYSTREAM_BIN=PATH measures that binary instead of building one;
# CACHE_MB sets state.cache_mb (default: the configuration's default, 64);
# REUSE_STATE=1 skips steps 2 and 3 when the state of an earlier run exists.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000000}"
WORK="${BENCH_DIR:-${TMPDIR:-/tmp}/jurystream-bench}"
mkdir -p "$WORK"
HIST="$WORK/history-$N.jsonl"
[ -f "$HIST" ] || python3 scripts/gen-history.py --inferences "$N" --out "$HIST"
TARGET="${CARGO_TARGET_DIR:-target}"
BIN="${JURYSTREAM_BIN:-$TARGET/release/jurystream}"
[ -n "${JURYSTREAM_BIN:-}" ] || cargo build --release --locked --bins
CONFIG="$WORK/state-bench.toml"
: > "$CONFIG"
[ -z "${CACHE_MB:-}" ] || printf '[state]\ncache_mb = %s\n' "$CACHE_MB" > "$CONFIG"

measure() { # label cmd... (events are discarded: a long history prints gigabytes)
    local label="$1"; shift
    /usr/bin/time -f "%e %M" -o "$WORK/time.txt" "$@" > /dev/null 2> "$WORK/$label.err" \
        || { echo "$label failed:"; tail -5 "$WORK/$label.err"; exit 1; }
    read -r secs kb < "$WORK/time.txt"
    printf '%-28s %8.2f s   peak RSS %6.0f MiB\n' "$label" "$secs" "$((kb / 1024))"
}

STATE="$WORK/state-$N"
if [ "${REUSE_STATE:-0}" = 1 ] && [ -d "$STATE" ]; then
    echo "reusing $STATE"
else
rm -rf "$STATE"
cat "$HIST" > /dev/null # page cache
echo "history: $(wc -l < "$HIST") votes, $N inferences ($HIST)"
measure "replay --state-dir" "$BIN" replay --config "$CONFIG" --input "$HIST" --state-dir "$STATE"
echo "state size: $(du -sh "$STATE" | cut -f1)"
for i in 1 2 3; do
    python3 scripts/gen-history.py --after "$HIST" --out "$WORK/one.jsonl"
    # a new inference each time (the id is fixed; use the run number)
    sed -i "s/inf-99999999/inf-9999999$i/; s/v-999999999/v-99999999$i/" "$WORK/one.jsonl"
    measure "one more vote, run $i" "$BIN" replay --config "$CONFIG" --input "$WORK/one.jsonl" --state-dir "$STATE"
done
fi

[ "${BROKER:-0}" = 1 ] || exit 0
PORT="${BENCH_PORT:-19193}"
scripts/broker.sh stop "$PORT" >/dev/null 2>&1 || true
scripts/broker.sh start "$PORT"
trap 'scripts/broker.sh stop "$PORT" >/dev/null 2>&1 || true' EXIT
RUN="state$$"
LISTEN_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
mkdir -p "$WORK/run-$RUN"
cp -r "$STATE" "$WORK/run-$RUN/$RUN-votes-0"
cat > "$WORK/run-$RUN.toml" <<TOML
[outputs]
scores_topic = "$RUN-scores"
flags_topic = "$RUN-flags"
dlq_topic = "$RUN-dlq"
[metrics]
listen = "127.0.0.1:$LISTEN_PORT"
[kafka]
brokers = "127.0.0.1:$PORT"
group_id = "$RUN-group"
input_topics = ["$RUN-votes"]
topic_partitions = 1
delivery = "exactly_once_outbox"
[kafka.properties]
"session.timeout.ms" = "6000"
"max.poll.interval.ms" = "6000"
[state]
dir = "$WORK/run-$RUN"
$( [ -z "${CACHE_MB:-}" ] || echo "cache_mb = $CACHE_MB" )
TOML
"$BIN" run --config "$WORK/run-$RUN.toml" 2> "$WORK/run.err" &
PID=$!
START=$(date +%s.%N)
until curl -sf "http://127.0.0.1:$LISTEN_PORT/readyz" > /dev/null 2>&1; do
    kill -0 "$PID" 2>/dev/null || { echo "run exited:"; tail -5 "$WORK/run.err"; exit 1; }
    sleep 0.05
done
END=$(date +%s.%N)
RSS=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$PID/status")
HWM=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$PID/status")
python3 -c "print(f'run: ready after {$END - $START:.2f} s (process start to /readyz 200, includes joining the group), RSS $RSS MiB (peak $HWM MiB)')"
# The test broker holds a first join for the rebalance timeout (6 s here):
# the restore itself is the time from assignment to resume.
grep -h "restored partitions resumed" "$WORK/run.err" | tail -1
kill -TERM "$PID"; wait "$PID" || true
rm -rf "$WORK/run-$RUN"
