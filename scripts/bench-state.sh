#!/usr/bin/env bash
# State benchmark: memory and time of a long history kept in
# RocksDB.
#   scripts/bench-state.sh [INFERENCES]     (default 1000000; try 10000000)
# 1. generates the history (scripts/gen-history.py: INFERENCES inferences
#    over 60 days, 3 votes each, one rubric) unless it exists;
# 2. `replay --state-dir` of the whole history (time, peak RSS, state size);
# 3. continues that state with a file of one more vote (time, peak RSS);
# 4. with BROKER=1: `jurystream run` on a partition holding that state
#    (copied into its state.dir) on the test broker: time from start to
#    /readyz = 200, and its RSS then.
# 5. with CHANGELOG=1: a changelog-only restore of that state. The test
#    broker (in memory) gets the input topic (1 partition) and its
#    changelog, and benches/changelog_seed.rs produces every record of the
#    state to changelog partition 0 (the state keys as the service sends
#    them, a delivered cycle marker every SEED_CYCLE records (default
#    10000) with next_offset 0: the input topic is empty); then `jurystream
#    run` starts on an EMPTY state.dir with the configuration of step 4
#    (exactly_once_outbox, session.timeout.ms = max.poll.interval.ms =
#    6000, so a restore that kept the poll loop from polling would get the
#    member expelled). Measured: records and bytes seeded and the seed
#    time; time from start to /readyz = 200; the restore's own figures
#    (log lines "partition state restored": changelog_records, elapsed_ms;
#    "restored partitions resumed": elapsed_ms); VmRSS/VmHWM of the service
#    (and the broker's VmRSS) sampled every second until ready and for
#    SETTLE seconds (default 15) after; the log lines that would show the
#    member leaving the group (assignments, revokes, lost partitions,
#    rebalance errors, session restarts, poll interval exceeded); one
#    query of a restored inference. Logs stay in $WORK/changelog-$N.*
#    (run.err, seed.out, rss.txt). SEED_BIN=PATH uses that changelog_seed
#    instead of building it (cargo bench --no-run).
# JURYSTREAM_BIN=PATH measures that binary instead of building one;
# CACHE_MB sets state.cache_mb (default: the configuration's default, 64);
# REUSE_STATE=1 skips steps 1 to 3 when the state of an earlier run exists
# (the history file is then not needed); PIPE_HISTORY=1 writes no history
# file (replays the generator's output through a pipe; no step 3).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N="${1:-1000000}"
WORK="${BENCH_DIR:-${TMPDIR:-/tmp}/jurystream-bench}"
mkdir -p "$WORK"
HIST="$WORK/history-$N.jsonl"
STATE="$WORK/state-$N"
REUSE=0
[ "${REUSE_STATE:-0}" = 1 ] && [ -d "$STATE" ] && REUSE=1
PIPE="${PIPE_HISTORY:-0}"
[ "$REUSE" = 1 ] || [ "$PIPE" = 1 ] || [ -f "$HIST" ] \
    || python3 scripts/gen-history.py --inferences "$N" --out "$HIST"
release_bin
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

if [ "$REUSE" = 1 ]; then
    echo "reusing $STATE"
else
rm -rf "$STATE"
if [ "$PIPE" = 1 ]; then
    # No history file (a 10 M history is 5.6 GB): generated into the replay
    # through a pipe (the replay's time then includes sharing the CPU with
    # the generator), and step 3 is skipped (it needs the file).
    echo "history: $N inferences, generated through a pipe"
    measure "replay --state-dir (pipe)" "$BIN" replay --config "$CONFIG" \
        --input <(python3 scripts/gen-history.py --inferences "$N") --state-dir "$STATE"
else
    cat "$HIST" > /dev/null # page cache
    echo "history: $(wc -l < "$HIST") votes, $N inferences ($HIST)"
    measure "replay --state-dir" "$BIN" replay --config "$CONFIG" --input "$HIST" --state-dir "$STATE"
fi
echo "state size: $(du -sh "$STATE" | cut -f1)"
[ "$PIPE" = 1 ] || for i in 1 2 3; do
    python3 scripts/gen-history.py --after "$HIST" --out "$WORK/one.jsonl"
    # a new inference each time (the id is fixed; use the run number)
    sed -i "s/inf-99999999/inf-9999999$i/; s/v-999999999/v-99999999$i/" "$WORK/one.jsonl"
    measure "one more vote, run $i" "$BIN" replay --config "$CONFIG" --input "$WORK/one.jsonl" --state-dir "$STATE"
done
fi

[ "${BROKER:-0}" = 1 ] || [ "${CHANGELOG:-0}" = 1 ] || exit 0
PORT="${BENCH_PORT:-19193}"
broker_restart "$PORT"
trap 'broker_stop "$PORT"' EXIT
BROKER_PID="$(broker_pid "$PORT")"

# run_config RUN LISTEN_PORT: the service's configuration (one input partition).
run_config() {
    cat <<TOML
[outputs]
scores_topic = "$1-scores"
flags_topic = "$1-flags"
dlq_topic = "$1-dlq"
[metrics]
listen = "127.0.0.1:$2"
[kafka]
brokers = "127.0.0.1:$PORT"
group_id = "$1-group"
input_topics = ["$1-votes"]
topic_partitions = 1
delivery = "exactly_once_outbox"
[kafka.properties]
"session.timeout.ms" = "6000"
"max.poll.interval.ms" = "6000"
[state]
dir = "$WORK/run-$1"
$( [ -z "${CACHE_MB:-}" ] || echo "cache_mb = $CACHE_MB" )
TOML
}

# rss_of PID: "VmRSS VmHWM" in MiB (0 0 once it is gone).
rss_of() {
    awk '/^VmRSS/ {r = int($2 / 1024)} /^VmHWM/ {h = int($2 / 1024)} END {print r + 0, h + 0}' \
        "/proc/$1/status" 2>/dev/null || echo "0 0"
}

# start_run RUN LISTEN_PORT LOG: starts `jurystream run` (PID), waits for
# /readyz = 200 while sampling memory every second into $SAMPLES ("seconds
# since start, VmRSS, VmHWM, broker VmRSS" in MiB); sets READY_S.
start_run() {
    "$BIN" run --config "$WORK/run-$1.toml" 2> "$3" &
    PID=$!
    local start elapsed next=0
    start=$(date +%s%N)
    : > "$SAMPLES"
    until curl -sf "http://127.0.0.1:$2/readyz" > /dev/null 2>&1; do
        kill -0 "$PID" 2>/dev/null || { echo "run exited:"; tail -5 "$3"; exit 1; }
        elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
        if [ "$elapsed" -ge $((next * 1000)) ]; then
            echo "$next $(rss_of "$PID") $(rss_of "$BROKER_PID" | cut -d' ' -f1)" >> "$SAMPLES"
            next=$((next + 1))
        fi
        sleep 0.05
    done
    elapsed=$(( ($(date +%s%N) - start) / 10000000 ))
    READY_S=$(printf '%d.%02d' $((elapsed / 100)) $((elapsed % 100)))
}

if [ "${BROKER:-0}" = 1 ]; then
RUN="state$$"
LISTEN_PORT="$(any_free_port)"
mkdir -p "$WORK/run-$RUN"
cp -r "$STATE" "$WORK/run-$RUN/$RUN-votes-0"
run_config "$RUN" "$LISTEN_PORT" > "$WORK/run-$RUN.toml"
SAMPLES="$WORK/rss.txt"
start_run "$RUN" "$LISTEN_PORT" "$WORK/run.err"
read -r RSS HWM < <(rss_of "$PID")
echo "run: ready after $READY_S s (process start to /readyz 200, includes joining the group), RSS $RSS MiB (peak $HWM MiB)"
# The test broker holds a first join for the rebalance timeout (6 s here):
# the restore itself is the time from assignment to resume.
grep -h "restored partitions resumed" "$WORK/run.err" | tail -1
kill -TERM "$PID"; wait "$PID" || true
rm -rf "$WORK/run-$RUN"
fi

[ "${CHANGELOG:-0}" = 1 ] || exit 0
if [ -z "${SEED_BIN:-}" ]; then
    . scripts/kafka-bench-lib.sh
    SEED_BIN="$(bench_exe changelog_seed)"
    [ -n "$SEED_BIN" ] || { echo "cannot build benches/changelog_seed.rs"; exit 1; }
fi
RUN="cl$$"
OUT="$WORK/changelog-$N"
LISTEN_PORT="$(any_free_port)"
rm -rf "$WORK/run-$RUN"
mkdir -p "$WORK/run-$RUN" # empty: the changelog is all there is
run_config "$RUN" "$LISTEN_PORT" > "$WORK/run-$RUN.toml"
echo "changelog-only restore: state $STATE ($(du -sh "$STATE" | cut -f1)), cache_mb ${CACHE_MB:-64 (default)}"
/usr/bin/time -f "%e %M" -o "$WORK/time.txt" "$SEED_BIN" --config "$WORK/run-$RUN.toml" \
    --state-dir "$STATE" --create-topics --cycle-records "${SEED_CYCLE:-10000}" \
    > "$OUT.seed.out" 2> "$OUT.seed.err" \
    || { echo "seeding failed:"; tail -5 "$OUT.seed.err"; exit 1; }
read -r secs kb < "$WORK/time.txt"
sed 's/^/  /' "$OUT.seed.out"
printf 'seed: %.1f s, seeder peak RSS %d MiB, broker RSS %s MiB after seeding\n' \
    "$secs" "$((kb / 1024))" "$(rss_of "$BROKER_PID" | cut -d' ' -f1)"
SAMPLES="$OUT.rss.txt"
start_run "$RUN" "$LISTEN_PORT" "$OUT.run.err"
read -r RSS HWM < <(rss_of "$PID")
PEAK_SAMPLE=$(awk 'BEGIN {m = 0} $2 > m {m = $2} END {print m}' "$SAMPLES")
echo "run (empty state.dir): ready after $READY_S s (process start to /readyz 200), RSS at ready $RSS MiB, VmHWM $HWM MiB, highest 1 s sample before ready $PEAK_SAMPLE MiB"
grep -h "partition state restored" "$OUT.run.err" | tail -1 | sed 's/^/  /'
grep -h "restored partitions resumed" "$OUT.run.err" | tail -1 | sed 's/^/  /'
python3 - "$OUT.run.err" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.findall(r"partition state restored .*?changelog_records=(\d+) .*?elapsed_ms=(\d+)", text)
if m:
    n, ms = map(int, m[-1])
    print(f"restore: {n} changelog records in {ms / 1000:.1f} s ({n / max(ms, 1) * 1000:.0f} records/s, "
          "from the restore thread's start to the state loaded)")
# Progress lines (every 2 s): the rate in each fifth of the restore, to
# see whether it slows down as the store grows.
p = [(int(s), int(n)) for n, s in re.findall(r"restoring from the changelog .*?changelog_records=(\d+) elapsed_s=(\d+)", text)]
if len(p) >= 10:
    k = len(p) // 5
    rates = []
    for i in range(5):
        (s0, n0), (s1, n1) = p[i * k], p[min((i + 1) * k, len(p) - 1)]
        rates.append(f"{(n1 - n0) / max(s1 - s0, 1):.0f}")
    print("restore rate by fifth (records/s):", " ".join(rates))
PY
# After ready: does the member stay (and memory settle)?
for _ in $(seq 1 "${SETTLE:-15}"); do
    sleep 1
    kill -0 "$PID" 2>/dev/null || { echo "run exited after ready:"; tail -5 "$OUT.run.err"; break; }
    echo "after-ready $(rss_of "$PID") $(rss_of "$BROKER_PID" | cut -d' ' -f1)" >> "$SAMPLES"
done
read -r RSS2 HWM2 < <(rss_of "$PID")
echo "after ${SETTLE:-15} s more: RSS $RSS2 MiB, VmHWM $HWM2 MiB"
echo "memory samples (s since start, VmRSS, VmHWM, broker VmRSS; MiB), every 10th, in $SAMPLES:"
awk '$1 != "after-ready" && NR % 10 == 1 {print} $1 == "after-ready" {a[++n] = $0}
    END {if (n) {print a[1]; if (n > 1) print a[n]}}' "$SAMPLES" | tail -n 60 | paste -sd ';' | fold -w 150 | sed 's/^/  /'
QUERY_ID="$(printf 'inf-%08d' $((N - 1)))"
CODE=$(curl -s -o "$OUT.query.json" -w '%{http_code}' "http://127.0.0.1:$LISTEN_PORT/v1/inferences/$QUERY_ID" || true)
echo "GET /v1/inferences/$QUERY_ID: $CODE $(head -c 300 "$OUT.query.json")"
echo "group membership (expect 1 assignment and nothing else):"
for pat in "partitions assigned" "partition revoked" "partitions lost" "rebalance error" \
        "session ended" "maximum poll interval\|MAXPOLL" "leav" "consumer error" " ERROR \| WARN "; do
    # (librdkafka's CONFWARN about consumer properties given to a producer aside)
    printf '  %-36s %s\n' "$pat" "$(grep -v CONFWARN "$OUT.run.err" | grep -c -- "$pat" || true)"
done
grep -h -- "partitions assigned\|revoked\|lost\|rebalance\|session ended\|poll interval\|MAXPOLL\| ERROR \| WARN " \
    "$OUT.run.err" | grep -v CONFWARN | head -10 | sed 's/^/  | /'
kill -TERM "$PID"; wait "$PID" || true
# The restored state answers as the replayed one does.
if diff <("$BIN" inspect --state-dir "$STATE" --inference "$QUERY_ID" | grep -v '"partition"') \
        <("$BIN" inspect --state-dir "$WORK/run-$RUN" --inference "$QUERY_ID" | grep -v '"partition"') > /dev/null; then
    echo "inspect $QUERY_ID: restored state = replayed state"
else
    echo "inspect $QUERY_ID: restored state DIFFERS from the replayed state"
fi
echo "restored state.dir: $(du -sh "$WORK/run-$RUN" | cut -f1)"
rm -rf "$WORK/run-$RUN" "$WORK/run-$RUN.toml"
