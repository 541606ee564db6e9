#!/usr/bin/env bash
# contract §14 cost, measured in pairs run at the same time: each
# pair is one `off` run and one run in MODE, started together on the two
# cores, so that both see the same machine; the ratio of their CPU
# (user + system) is one sample, and the report is the mean over PAIRS
# with one standard error. On this test machine the CPU of one run moves
# by ±5 % from run to run and by more from hour to hour, so runs one after
# the other (scripts/bench-reputation.sh) need ten rounds to say whether
# a mode is within 10 % of `off`; within an hour a pair's ratio moves by
# ±2 %, but between hours it still moves by several per cent
# (PERFORMANCE.md, "Measured in pairs"): compare ratios of one hour.
# Both runs of a pair compete for the cores, which is not how either runs
# alone: use this to compare, and bench-reputation.sh for absolute
# numbers.
#   scripts/bench-pairs.sh [VOTES]     (default 1000000)
# PAIRS (default 8) per mode; MODES (default "shadow learned"; `confusion`
# is learned with contract §15's model on every rubric);
# EPOCH_SECONDS (default 3600); JURYSTREAM_BIN=PATH measures that binary
# instead of building one.
# KAFKA=1 also measures `jurystream run` on a backlog: per pair a fresh
# test broker and topic (4 partitions) preloaded with the file, and two
# groups with state directories of their own that consume it at the same
# time, each until its group committed every input offset.
# LIVE=1 (with KAFKA=1) also measures `run` at a live rate: per pair, two
# groups (off and MODE) on one fresh topic, both ready before votes are
# produced to it at LIVE_RATE votes/s (default 20000) for LIVE_SECONDS
# (default 30); each run's CPU from then until its group committed every
# offset (bench-reputation.sh's live measure, the two runs at once).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N="${1:-1000000}"
PAIRS="${PAIRS:-8}"
MODES="${MODES:-shadow learned}"
EPOCH="${EPOCH_SECONDS:-3600}"
bench_votes "$N"
release_bin
for mode in off $MODES; do
    printf '[batching]\nwindow_seconds = 60\n[reputation]\n%s\nepoch_seconds = %s\n' \
        "$(reputation_keys "$mode")" "$EPOCH" > "$WORK/pair-$mode.toml"
done
cat "$INPUT" > /dev/null

# summary LABEL: "mode off_cpu mode_cpu" lines on stdin, the ratios' mean.
summary() {
    python3 -c '
import statistics as st, sys
rows = {}
for line in sys.stdin:
    mode, off, cpu = line.split()
    rows.setdefault(mode, []).append(float(cpu) / float(off))
for mode, r in rows.items():
    se = st.stdev(r) / len(r) ** 0.5 if len(r) > 1 else float("nan")
    print(f"{sys.argv[1]} {mode}: {st.mean(r):.3f} x off ± {se:.3f} over {len(r)} pairs "
          f"(median {st.median(r):.3f}; " + ", ".join(f"{x:.3f}" for x in r) + ")")' "$1"
}

# cpu_of FILE: user + system seconds that /usr/bin/time wrote to FILE.
cpu_of() { awk '{ print $1 + $2 }' "$1"; }

for mode in $MODES; do
    for i in $(seq "$PAIRS"); do
        # Alternate which of the two starts first.
        if [ $((i % 2)) = 1 ]; then order="off $mode"; else order="$mode off"; fi
        pids=()
        for m in $order; do
            /usr/bin/time -f "%U %S" -o "$WORK/pair-$m.time" \
                "$BIN" replay --config "$WORK/pair-$m.toml" --input "$INPUT" > /dev/null 2>&1 &
            pids+=($!)
        done
        wait "${pids[@]}"
        echo "$mode $(cpu_of "$WORK/pair-off.time") $(cpu_of "$WORK/pair-$mode.time")"
    done
done | tee "$WORK/pair-replay.txt" | summary replay

if [ "${KAFKA:-0}" = 1 ]; then
    PORT="${BENCH_PORT:-19196}"
    BROKERS="127.0.0.1:$PORT"
    . scripts/kafka-bench-lib.sh
    # (BENCH_HELPER=PATH: an already built kafka_passthrough bench binary.)
    HELPER="${BENCH_HELPER:-$(bench_exe kafka_passthrough)}"
    trap 'broker_stop "$PORT"' EXIT
    TOTAL="$(grep -cv '^[[:space:]]*$' "$INPUT")"
    TICK="$(getconf CLK_TCK)"
    # ticks_of PID: the process's user + system clock ticks so far.
    ticks_of() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
    for mode in $MODES; do
        for i in $(seq "$PAIRS"); do
            # A fresh broker each pair: the test broker keeps every topic
            # in memory (PERFORMANCE.md, "Turn about in alternating order").
            broker_restart "$PORT" >/dev/null
            round="pair$$-$mode-$i"
            preload "$BIN" "$round" "$INPUT" at_least_once "$BROKERS" "$WORK" >&2
            declare -A pid=() waiter=()
            n=0
            for m in off "$mode"; do
                n=$((n + 1))
                reputation_config "$round" "$round-$m" "$WORK/state-$round-$m" \
                    "127.0.0.1:$((PORT + 100 + n))" "$BROKERS" "$m" "$EPOCH" > "$WORK/$round-$m.toml"
                rm -rf "$WORK/state-$round-$m"
            done
            for m in off "$mode"; do
                "$BIN" run --config "$WORK/$round-$m.toml" > "$WORK/$round-$m.log" 2>&1 &
                pid[$m]=$!
            done
            for m in off "$mode"; do
                "$HELPER" wait "$BROKERS" "$round-votes" "$round-$m" "$TOTAL" > /dev/null &
                waiter[$m]=$!
            done
            line="$mode"
            for m in off "$mode"; do
                # Each run's CPU when its own group has committed every
                # offset (an idle `run` costs nothing measurable).
                wait "${waiter[$m]}"
                ticks=$(ticks_of "${pid[$m]}")
                line="$line $(python3 -c "print($ticks / $TICK)")"
            done
            for m in off "$mode"; do
                kill -TERM "${pid[$m]}"
                wait "${pid[$m]}" || true
                rm -rf "$WORK/state-$round-$m"
            done
            echo "$line"
        done
    done | tee "$WORK/pair-run.txt" | summary run
fi

if [ "${KAFKA:-0}" = 1 ] && [ "${LIVE:-0}" = 1 ]; then
    RATE="${LIVE_RATE:-20000}"
    SECONDS_LIVE="${LIVE_SECONDS:-30}"
    broker_restart "$PORT" >/dev/null
    for mode in $MODES; do
        for i in $(seq "$PAIRS"); do
            live="pair$$-live-$mode-$i"
            "$HELPER" pace "$BROKERS" "$live-votes" "$INPUT" 1 0 > /dev/null
            declare -A pid=() t0=()
            n=0
            for m in off "$mode"; do
                n=$((n + 1))
                listen="127.0.0.1:$((PORT + 100 + n))"
                # No idle flush while the file's (past) vote times flow.
                reputation_config "$live" "$live-$m" "$WORK/state-$live-$m" "$listen" \
                    "$BROKERS" "$m" "$EPOCH" \
                    | sed 's/^idle_flush_seconds = .*/idle_flush_seconds = 3600/' > "$WORK/$live-$m.toml"
                rm -rf "$WORK/state-$live-$m"
                "$BIN" run --config "$WORK/$live-$m.toml" > "$WORK/$live-$m.log" 2>&1 &
                pid[$m]=$!
                wait_ready "$listen"
            done
            for m in off "$mode"; do
                t0[$m]=$(ticks_of "${pid[$m]}")
            done
            read -r produced _ < <("$HELPER" pace "$BROKERS" "$live-votes" "$INPUT" "$RATE" "$SECONDS_LIVE")
            line="$mode"
            for m in off "$mode"; do
                "$HELPER" wait "$BROKERS" "$live-votes" "$live-$m" "$produced" > /dev/null
                ticks=$(ticks_of "${pid[$m]}")
                line="$line $(python3 -c "print(($ticks - ${t0[$m]}) / $TICK)")"
            done
            for m in off "$mode"; do
                kill -TERM "${pid[$m]}"
                wait "${pid[$m]}" || true
                rm -rf "$WORK/state-$live-$m"
            done
            echo "$line"
        done
    done | tee "$WORK/pair-live.txt" | summary live
fi
