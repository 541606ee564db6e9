#!/usr/bin/env bash
# `run` against its own engine and its peers, in one run on the
# test broker (the prebuilt tansu of scripts/broker.sh, 4 partitions):
#   scripts/bench-service.sh [VOTES]        (default 1000000)
#
# 1. Backlog: VOTES votes (scripts/gen-votes.py) preloaded on one topic,
#    then, each with a fresh group and state, timed from its start until
#    its group committed every input offset: the librdkafka passthrough
#    (benches/kafka_passthrough.rs), `jurystream run` in each delivery mode
#    (MODES, default all three), and Quix Streams' exactly-once app
#    (benches/quix_peer.py; QUIX=0 leaves it out). `jurystream replay` of
#    the same file beside them. CPU = the process's user + system time
#    (from /proc before it is stopped; replay's and the passthrough's from
#    this shell's children), and the broker's CPU over the same span (it
#    shares the 2 cores: what is left for the processor, and where a
#    throughput ceiling comes from).
# 2. Latency: for each mode, votes produced at 10 % and at 90 % of the
#    throughput that mode reached in step 1 (`kafka_passthrough pace`, for
#    LATENCY_SECONDS, default 15) to a fresh topic that a fresh `run`
#    consumes live; reported: p50 / p99 of
#    `jurystream_vote_commit_latency_seconds` (each input record, from its
#    read to its cycle's commit), interpolated within the histogram's
#    buckets, scraped once everything produced is committed.
# Targets: run's CPU per vote <= 2x replay's in every mode;
# exactly_once >= 0.8x at_least_once's throughput; exactly_once >= 5x
# Quix's exactly-once throughput at >= 4x less CPU per vote.
# PERF=1 also records each backlog `run` with `perf record -F 499` (to
# $WORK/perf-MODE.data) and prints its CPU by thread (docs/PERFORMANCE.md's
# breakdown; perf's own cost shows in that run's numbers).
# JURYSTREAM_BIN=PATH measures that binary instead of the release build;
# COMMIT_INTERVAL_MS applies to every mode (default: each mode's own).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N="${1:-1000000}"
MODES="${MODES:-at_least_once exactly_once exactly_once_outbox}"
QUIX="${QUIX:-1}"
LATENCY_SECONDS="${LATENCY_SECONDS:-15}"
PORT="${BENCH_PORT:-19194}"
bench_votes "$N"
BROKERS="127.0.0.1:$PORT"

. scripts/kafka-bench-lib.sh
release_bin
HELPER="$(bench_exe kafka_passthrough)"
if [ "$QUIX" = 1 ]; then
    quix_venv
fi

broker_restart "$PORT"
trap 'broker_stop "$PORT"' EXIT
RUN="svc$$"
TCK="$(getconf CLK_TCK)"
BROKER_PID="$(broker_pid "$PORT")"
broker_ticks() { awk '{print $14 + $15}' "/proc/$BROKER_PID/stat"; }
# This shell's waited-for children's CPU ticks.
child_ticks() { awk '{print $16 + $17}' /proc/$$/stat; }
RESULTS="$WORK/service-results.txt"
: > "$RESULTS"

if [ "$QUIX" = 1 ]; then
    # Quix derives its changelog's settings from the input topic's, and
    # tansu 0.6.0 describes only the settings a topic was created with.
    "$VENV/bin/python" - "$BROKERS" "$RUN-votes" <<'PY' 2>/dev/null
import sys
from confluent_kafka.admin import AdminClient, NewTopic
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
config = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
for fut in admin.create_topics([NewTopic(sys.argv[2], 4, 1, config=config)]).values():
    fut.result()
PY
fi
preload "$BIN" "$RUN" "$INPUT" at_least_once "$BROKERS" "$WORK"
TOTAL="$(grep -cv '^[[:space:]]*$' "$INPUT")"

# measure LABEL GROUP CMD...: appends "LABEL wall_s cpu_s broker_cpu_s
# steady_votes_per_s" to RESULTS; the wall time from start to every offset
# committed by GROUP; the steady rate from GROUP's first commit to its last
# (without the start: joining the group, the broker's initial rebalance
# delay, restore, the first cycle).
measure() {
    local label="$1" group="$2"; shift 2
    local start end ticks pid b0 b1
    b0=$(broker_ticks)
    start=$(date +%s.%N)
    "$@" > "$WORK/$label.log" 2>&1 &
    pid=$!
    local perf=""
    if [ "${PERF:-0}" = 1 ] && [ "${2:-}" = run ]; then
        perf record -F 499 -g -p "$pid" -o "$WORK/perf-$label.data" > /dev/null 2>&1 &
        perf=$!
    fi
    local waited first first_n
    read -r waited first first_n < <("$HELPER" wait "$BROKERS" "$RUN-votes" "$group" "$TOTAL")
    end=$(date +%s.%N)
    ticks=$(awk '{print $14 + $15}' /proc/$pid/stat)
    b1=$(broker_ticks)
    if [ -n "$perf" ]; then
        kill -INT "$perf"; wait "$perf" || true
    fi
    kill -TERM $pid; wait $pid || true
    if [ -n "$perf" ]; then
        echo "  $label, CPU by thread:"
        perf report -i "$WORK/perf-$label.data" --no-children --sort comm --stdio -g none 2>/dev/null \
            | grep -v '^#' | grep -v '^$' | head -8 | sed 's/^/    /'
    fi
    python3 -c 'import sys; s, e, t, k, b, w, f, fn, n = map(float, sys.argv[2:11]); print(f"{sys.argv[1]} {e - s:.3f} {t / k:.2f} {b / k:.2f} {(n - fn) / max(w - f, 1e-9):.0f}")' \
        "$label" "$start" "$end" "$ticks" "$TCK" "$((b1 - b0))" "$waited" "$first" "$first_n" "$TOTAL" >> "$RESULTS"
    echo "  $(tail -1 "$RESULTS")"
}

echo "backlog: $TOTAL votes"
B0=$(broker_ticks)
C0=$(child_ticks)
PASS_S="$("$HELPER" pass "$BROKERS" "$RUN-votes" "$RUN-pass-out" "$RUN-pass" "$TOTAL")"
B1=$(broker_ticks)
C1=$(child_ticks)
python3 -c 'import sys; w, c, b, k = map(float, sys.argv[1:5]); print(f"passthrough {w} {c / k:.2f} {b / k:.2f}")' \
    "$PASS_S" "$((C1 - C0))" "$((B1 - B0))" "$TCK" >> "$RESULTS"
echo "  $(tail -1 "$RESULTS")"
# replay: the same engine on the same file, no Kafka.
REPLAY_CONFIG="$WORK/replay.toml"
: > "$REPLAY_CONFIG"
T0=$(awk -v k="$TCK" '{print ($14 + $15 + $16 + $17)}' /proc/$$/stat)
START=$(date +%s.%N)
"$BIN" replay --config "$REPLAY_CONFIG" --input "$INPUT" > /dev/null
END=$(date +%s.%N)
T1=$(awk '{print ($14 + $15 + $16 + $17)}' /proc/$$/stat)
python3 -c 'import sys; s, e, a, b, k = map(float, sys.argv[1:6]); print(f"replay {e - s:.3f} {(b - a) / k:.2f} 0")' \
    "$START" "$END" "$T0" "$T1" "$TCK" >> "$RESULTS"
echo "  $(tail -1 "$RESULTS")"
for mode in $MODES; do
    service_config "$RUN" "$RUN-$mode" "$WORK/state-$RUN-$mode" 127.0.0.1:0 "$mode" "$BROKERS" > "$WORK/$mode.toml"
    rm -rf "$WORK/state-$RUN-$mode"
    measure "$mode" "$RUN-$mode" "$BIN" run --config "$WORK/$mode.toml"
    rm -rf "$WORK/state-$RUN-$mode"
done
if [ "$QUIX" = 1 ]; then
    rm -rf "$WORK/quix-state-$RUN"
    measure quix_exactly_once "$RUN-quix" "$VENV/bin/python" benches/quix_peer.py "$BROKERS" \
        "$RUN-votes" "$RUN-quix-scores" "$RUN-quix" "$WORK/quix-state-$RUN" exactly-once
    rm -rf "$WORK/quix-state-$RUN"
fi

# latency MODE PCT RATE: a live run at RATE votes/s; appends "latency MODE
# PCT rate p50_ms p99_ms commits" to RESULTS.
latency() {
    local mode="$1" pct="$2" rate="$3" live="$RUN-$1-$2" listen pid produced
    listen="127.0.0.1:$(any_free_port)"
    # No idle flush while the file's (past) vote times flow.
    service_config "$live" "$live-group" "$WORK/state-$live" "$listen" "$mode" "$BROKERS" \
        | sed 's/^idle_flush_seconds = .*/idle_flush_seconds = 3600/' > "$WORK/$live.toml"
    rm -rf "$WORK/state-$live"
    "$HELPER" pace "$BROKERS" "$live-votes" "$INPUT" 1 0 > /dev/null
    "$BIN" run --config "$WORK/$live.toml" > "$WORK/$live.log" 2>&1 &
    pid=$!
    wait_ready "$listen"
    read -r produced _ < <("$HELPER" pace "$BROKERS" "$live-votes" "$INPUT" "$rate" "$LATENCY_SECONDS")
    "$HELPER" wait "$BROKERS" "$live-votes" "$live-group" "$produced" > /dev/null
    # The group commit can precede the metrics' update by the commit's end.
    sleep 0.5
    curl -sf "http://$listen/metrics" > "$WORK/$live.metrics" || : > "$WORK/$live.metrics"
    kill -TERM $pid; wait $pid || true
    rm -rf "$WORK/state-$live"
    python3 - "$WORK/$live.metrics" "$mode" "$pct" "$rate" >> "$RESULTS" <<'PY'
import re, sys
name = "jurystream_vote_commit_latency_seconds"
buckets = []
for line in open(sys.argv[1]):
    m = re.match(name + r'_bucket\{le="([^"]+)"\} (\S+)', line)
    if m:
        buckets.append((float(m.group(1)), float(m.group(2))))
count = buckets[-1][1] if buckets else 0
def q(p):
    # Linear within the bucket that holds the p-quantile.
    lo, below = 0.0, 0.0
    for le, c in buckets:
        if c >= p * count:
            if le == float("inf"):
                return lo * 1000
            return (lo + (le - lo) * (p * count - below) / max(c - below, 1)) * 1000
        lo, below = le, c
    return float("nan")
print(f"latency {sys.argv[2]} {sys.argv[3]} {sys.argv[4]} {q(0.5):.1f} {q(0.99):.1f} {int(count)}")
PY
    echo "  $(tail -1 "$RESULTS")"
}

echo "latency, ${LATENCY_SECONDS} s per point"
for mode in $MODES; do
    wall="$(awk -v m="$mode" '$1 == m {print $2}' "$RESULTS")"
    for pct in 10 90; do
        latency "$mode" "$pct" "$(python3 -c "print(int($TOTAL / $wall * $pct / 100))")"
    done
done

python3 - "$RESULTS" "$TOTAL" <<'PY'
import sys
rows, lat = {}, []
n = int(sys.argv[2])
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "latency":
        lat.append(f[1:])
    else:
        # The steady rate where measured (the runs), else the whole one.
        steady = float(f[4]) if len(f) > 4 else n / float(f[1])
        rows[f[0]] = (float(f[1]), float(f[2]), float(f[3]), steady)
print(f"\n{n} votes, 4 partitions, one run")
print(f"{'':22} {'time s':>8} {'votes/s':>10} {'steady/s':>10} {'CPU s/M votes':>14} {'x replay CPU':>13} {'broker CPU s/M':>15}")
rep = rows["replay"][1] * 1e6 / n
for k, (s, c, b, st) in rows.items():
    cpu = c * 1e6 / n
    ratio = f"{cpu / rep:13.2f}" if k != "passthrough" else f"{'':>13}"
    broker = f"{b * 1e6 / n:15.2f}" if k != "replay" else f"{'':>15}"
    print(f"{k:22} {s:8.2f} {n / s:10,.0f} {st:10,.0f} {cpu:14.2f} {ratio} {broker}")
if "exactly_once" in rows and "at_least_once" in rows:
    eo, alo = rows["exactly_once"], rows["at_least_once"]
    print(f"exactly_once / at_least_once throughput: {alo[0] / eo[0]:.2f} (steady: {eo[3] / alo[3]:.2f})")
if "exactly_once" in rows and "quix_exactly_once" in rows:
    (js, jc, _, jst), (qs, qc, _, qst) = rows["exactly_once"], rows["quix_exactly_once"]
    print(f"exactly_once / Quix exactly-once: {qs / js:.2f}x the throughput (steady: {jst / qst:.2f}x), "
          f"{qc / jc:.2f}x less CPU per vote")
for mode, pct, rate, p50, p99, count in lat:
    print(f"latency {mode:20} {pct:>3} % ({int(rate):,} votes/s): p50 {p50} ms, p99 {p99} ms ({count} records)")
PY
