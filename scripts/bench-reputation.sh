#!/usr/bin/env bash
# contract §14 cost: `jurystream replay` of the benchmark file in
# reputation.mode off, shadow and learned, turn about, best of ROUNDS, and
# what the open epochs add to the state and to the peak RSS. Turn about in
# alternating order (off shadow learned, then learned shadow off, ...), and
# each measure is also fitted with a drift across the runs
# (scripts/turnabout.py: each mode × off with one standard error): on a
# shared machine the runs' cost drifts, and a fixed order would charge the
# drift to the mode that always runs last.
#   scripts/bench-reputation.sh [VOTES]     (default 1000000)
# EPOCH_SECONDS (default 3600: the 6-hour file spans 6 epochs, so tables
# are built and used); ROUNDS (default 3); JURYSTREAM_BIN=PATH measures
# that binary instead of building one.
# KAFKA=1 also measures `jurystream run` (at_least_once, 4 partitions, the
# test broker of scripts/broker.sh) in each mode, turn about, ROUNDS
# rounds, each round on a fresh broker and preloaded topic, each run a
# fresh group and state directory:
# from its start until its group committed every input offset; CPU = the
# process's user + system time; and, sampled from its metrics, the most
# batches waiting at contract §14's barrier and the widest spread of its
# partitions' watermarks (how far the backlog's partitions drift apart);
# and the size of the state's SST files after its clean stop.
# LIVE=1 (with KAFKA=1) also measures `run` at a live rate: votes produced
# at LIVE_RATE votes/s (default 20000) for LIVE_SECONDS (default 30) to a
# fresh topic that a fresh `run` in each mode consumes as they come, turn
# about, ROUNDS rounds; CPU per million votes from ready to every offset
# committed (partitions in step, as in production: a batch seldom waits
# at the barrier, where a backlog's partitions drift apart).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N="${1:-1000000}"
ROUNDS="${ROUNDS:-3}"
EPOCH="${EPOCH_SECONDS:-3600}"
bench_votes "$N"
release_bin
for mode in off shadow learned; do
    printf '[batching]\nwindow_seconds = 60\n[reputation]\nmode = "%s"\nepoch_seconds = %s\n' \
        "$mode" "$EPOCH" > "$WORK/rep-$mode.toml"
done
cat "$INPUT" > /dev/null
# The modes in round $1's order: odd rounds forward, even rounds backward.
modes_of_round() { if [ $(($1 % 2)) = 1 ]; then echo off shadow learned; else echo learned shadow off; fi; }
# fit LABEL_FIELD COST_FIELD FILE: the drift-fitted ratios of FILE's runs.
fit() { awk -v l="$1" -v c="$2" '{ print $l, $c }' "$3" | python3 scripts/turnabout.py; }
measure() { # label cmd...
    local label="$1"; shift
    /usr/bin/time -f "%e %U %S %M" -o "$WORK/time.txt" "$@" > "$WORK/$label.out" 2> "$WORK/$label.err"
    read -r secs user sys kb < "$WORK/time.txt"
    echo "$label $secs $(python3 -c "print($user + $sys)") $kb $(wc -l < "$WORK/$label.out")"
}
for i in $(seq "$ROUNDS"); do
    for mode in $(modes_of_round "$i"); do
        measure "$mode" "$BIN" replay --config "$WORK/rep-$mode.toml" --input "$INPUT"
    done
done | tee "$WORK/replay-runs.txt" | python3 -c '
import sys
rows = {}
for line in sys.stdin:
    label, secs, cpu, kb, events = line.split()
    rows.setdefault(label, []).append((float(secs), float(cpu), int(kb), int(events)))
off = min(r[0] for r in rows["off"])
off_cpu = min(r[1] for r in rows["off"])
for label, rs in rows.items():
    best = min(r[0] for r in rs); cpu = min(r[1] for r in rs)
    print(f"{label:8s} best of {len(rs)}: {best:.2f} s wall ({best / off:.3f} x off), "
          f"{cpu:.2f} CPU-s ({cpu / off_cpu:.3f} x off), peak RSS {max(r[2] for r in rs) / 1024:.0f} MiB, "
          f"{rs[0][3]} events")
'
echo "replay, CPU:"; fit 1 3 "$WORK/replay-runs.txt"
# The state the open epochs add: the file replayed into a state directory
# with --keep-open (its batches and the last epochs stay open), default
# day-long epochs so that nothing of the 6-hour file is sealed: every
# (series, reviewer) value is held.
for mode in off shadow; do
    printf '[batching]\nwindow_seconds = 60\n[reputation]\nmode = "%s"\n' "$mode" > "$WORK/day-$mode.toml"
    rm -rf "$WORK/state-$mode"
    /usr/bin/time -f "%M" -o "$WORK/time.txt" "$BIN" replay --config "$WORK/day-$mode.toml" \
        --input "$INPUT" --state-dir "$WORK/state-$mode" --keep-open > /dev/null 2>&1
    echo "state ($mode, one open day): $(du -sm "$WORK/state-$mode" | cut -f1) MiB on disk, peak RSS $(( $(cat "$WORK/time.txt") / 1024 )) MiB"
done

if [ "${KAFKA:-0}" = 1 ]; then
    PORT="${BENCH_PORT:-19196}"
    BROKERS="127.0.0.1:$PORT"
    . scripts/kafka-bench-lib.sh
    HELPER="$(bench_exe kafka_passthrough)"
    broker_restart "$PORT"
    trap 'broker_stop "$PORT"' EXIT
    RUN="rep$$"
    LISTEN="127.0.0.1:$((PORT + 100))"
    # sample LISTEN PID: "waiting drift" lines (the most batches waiting at
    # contract §14's barrier, the widest spread of partition watermarks in
    # minutes) while PID runs.
    sample() {
        local most=0 widest=0
        while kill -0 "$2" 2>/dev/null; do
            # (Watermarks an idle flush moved to the wall clock left out.)
            read -r w d < <(curl -sf "http://$1/metrics" 2>/dev/null | awk -v now="$(date +%s)" '
                /^jurystream_reputation_pending_batches/ { w += $2 }
                /^jurystream_watermark_timestamp_seconds\{/ && $2 < now - 3600 {
                    if (n++ == 0 || $2 < lo) lo = $2; if ($2 > hi) hi = $2 }
                END { printf "%d %d\n", w, (n ? (hi - lo) / 60 : 0) }') || true
            [ "${w:-0}" -gt "$most" ] && most=$w
            [ "${d:-0}" -gt "$widest" ] && widest=$d
            echo "$most $widest"
            sleep 0.5
        done
    }
    TOTAL="$(grep -cv '^[[:space:]]*$' "$INPUT")"
    for i in $(seq "$ROUNDS"); do
        # A fresh broker and topic each round: the test broker keeps every
        # topic in memory, and each run on a broker that holds the earlier
        # ones costs more than the one before (PERFORMANCE.md, "Turn about
        # in alternating order").
        if [ "$i" -gt 1 ]; then
            scripts/broker.sh stop "$PORT" >/dev/null
            scripts/broker.sh start "$PORT" >/dev/null
        fi
        # This round's topic and groups ($RUN names the benchmark's).
        round="$RUN-r$i"
        preload "$BIN" "$round" "$INPUT" at_least_once "$BROKERS" "$WORK" >&2
        for mode in $(modes_of_round "$i"); do
            group="$round-$mode"
            state="$WORK/state-$group"
            reputation_config "$round" "$group" "$state" "$LISTEN" "$BROKERS" "$mode" "$EPOCH" \
                > "$WORK/$group.toml"
            rm -rf "$state"
            start=$(date +%s.%N)
            "$BIN" run --config "$WORK/$group.toml" > "$WORK/$group.log" 2>&1 &
            pid=$!
            # Batches waiting at the barrier and how far apart the
            # partitions' watermarks are (minutes), sampled twice a second.
            sample "$LISTEN" "$pid" > "$WORK/$group.waiting" &
            sampler=$!
            "$HELPER" wait "$BROKERS" "$round-votes" "$group" "$TOTAL" > /dev/null
            end=$(date +%s.%N)
            ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
            kill "$sampler" 2>/dev/null || true
            wait "$sampler" 2>/dev/null || true
            kill -TERM "$pid"
            wait "$pid" || true
            # The state after a clean stop: its SST files (sealed epochs'
            # open values leave as compaction reaches their series).
            sst=$(find "$state" -name '*.sst' -printf '%s\n' | awk '{ s += $1 } END { printf "%.1f", s / 1e6 }')
            rm -rf "$state"
            python3 -c 'import sys; s, e, t, k = map(float, sys.argv[2:6]); print(f"{sys.argv[1]} {e - s:.3f} {t / k:.2f} {sys.argv[6]} {sys.argv[7]}")' \
                "run-$mode" "$start" "$end" "$ticks" "$(getconf CLK_TCK)" \
                "$(tail -1 "$WORK/$group.waiting" | tr ' ' , | grep . || echo 0,0)" "$sst"
        done
    done | tee "$WORK/run-runs.txt" | python3 -c '
import sys
rows = {}
for line in sys.stdin:
    label, secs, cpu, waiting, sst = line.split()
    rows.setdefault(label, []).append((float(secs), float(cpu), waiting, float(sst)))
off = min(r[0] for r in rows["run-off"])
off_cpu = min(r[1] for r in rows["run-off"])
for label, rs in rows.items():
    best = min(r[0] for r in rs); cpu = min(r[1] for r in rs)
    sst = sum(r[3] for r in rs) / len(rs)
    print(f"{label:12s} best of {len(rs)}: {best:.2f} s wall ({best / off:.3f} x off), "
          f"{cpu:.2f} CPU-s ({cpu / off_cpu:.3f} x off), state {sst:.1f} MB of SST files at the end (mean); "
          f"per run, most batches waiting at the barrier, widest watermark spread (min): {[r[2] for r in rs]}")
'
    echo "run, CPU:"; fit 1 3 "$WORK/run-runs.txt"
fi

if [ "${KAFKA:-0}" = 1 ] && [ "${LIVE:-0}" = 1 ]; then
    RATE="${LIVE_RATE:-20000}"
    SECONDS_LIVE="${LIVE_SECONDS:-30}"
    cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
    for i in $(seq "$ROUNDS"); do
        for mode in $(modes_of_round "$i"); do
            live="$RUN-live-$mode-$i"
            state="$WORK/state-$live"
            listen="127.0.0.1:$((PORT + 100))"
            # No idle flush while the file's (past) vote times flow.
            reputation_config "$live" "$live-group" "$state" "$listen" "$BROKERS" "$mode" "$EPOCH" \
                | sed 's/^idle_flush_seconds = .*/idle_flush_seconds = 3600/' > "$WORK/$live.toml"
            rm -rf "$state"
            "$HELPER" pace "$BROKERS" "$live-votes" "$INPUT" 1 0 > /dev/null
            "$BIN" run --config "$WORK/$live.toml" > "$WORK/$live.log" 2>&1 &
            pid=$!
            wait_ready "$listen"
            t0=$(cpu_ticks "$pid")
            read -r produced _ < <("$HELPER" pace "$BROKERS" "$live-votes" "$INPUT" "$RATE" "$SECONDS_LIVE")
            "$HELPER" wait "$BROKERS" "$live-votes" "$live-group" "$produced" > /dev/null
            t1=$(cpu_ticks "$pid")
            kill -TERM "$pid"
            wait "$pid" || true
            rm -rf "$state"
            python3 -c 'import sys; t, k, n = map(float, sys.argv[2:5]); print(f"{sys.argv[1]} {t / k / n * 1e6:.2f} {n:.0f}")' \
                "live-$mode" "$((t1 - t0))" "$(getconf CLK_TCK)" "$produced"
        done
    done | tee "$WORK/live-runs.txt" | python3 -c '
import sys
rows = {}
for line in sys.stdin:
    label, cpu, n = line.split()
    rows.setdefault(label, []).append(float(cpu))
off = min(rows["live-off"])
for label, rs in rows.items():
    every = ", ".join(f"{r:.2f}" for r in rs)
    print(f"{label:12s} best of {len(rs)}: {min(rs):.2f} CPU-s per M votes ({min(rs) / off:.3f} x off), all: {every}")
'
    echo "run live, CPU per M votes:"; fit 1 2 "$WORK/live-runs.txt"
fi
