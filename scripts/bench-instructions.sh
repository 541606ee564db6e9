#!/usr/bin/env bash
# What contract §14's modes cost, counted in instructions instead of seconds:
# `jurystream replay` of the benchmark file under valgrind's
# callgrind in reputation.mode off, shadow and learned, and each mode's
# count × off's. On this shared machine a mode's CPU time moves by 10–30 %
# with the hour while the count of instructions the process executes (all
# its threads, RocksDB's background ones included) repeats within about
# 1 % (docs/PERFORMANCE.md, "Counted in instructions"). What it leaves
# out: the kernel's time (system calls, page faults) and what a cache
# miss costs.
#   scripts/bench-instructions.sh [VOTES]    (default 1000000)
# EPOCH_SECONDS (default 3600, as bench-reputation.sh); MODES (default
# "off shadow learned"; `confusion` is learned with contract §15's model); JURYSTREAM_BIN=PATH counts that binary instead of
# building one. KAFKA=1 also counts `jurystream run` on a backlog
# (at_least_once, 4 partitions, the test broker of scripts/broker.sh, a
# fresh broker, topic, group and state directory for each mode) from its
# start until its group committed every input offset, then its clean
# stop. Under callgrind a run takes about 50× as long (about 15 minutes a
# mode for the 1 M-vote file). The callgrind files stay in
# $BENCH_DIR/callgrind-{replay,run}-MODE.out for `callgrind_annotate`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
command -v valgrind > /dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
N="${1:-1000000}"
EPOCH="${EPOCH_SECONDS:-3600}"
MODES="${MODES:-off shadow learned}"
bench_votes "$N"
release_bin
# count OUT CMD...: runs CMD under callgrind into OUT; prints the count.
count() {
    local out="$1"; shift
    valgrind --tool=callgrind --callgrind-out-file="$out" "$@" > /dev/null 2> "$out.log"
    grep -o 'Collected : [0-9]*' "$out.log" | awk '{ print $3 }'
}
# ratios: "MODE COUNT" lines in, each with × off's count out.
ratios() {
    awk '{ n[NR] = $1; c[NR] = $2; if ($1 == "off") off = $2 }
        END { for (i = 1; i <= NR; i++)
            printf "%-8s %16.0f instructions%s\n", n[i], c[i], off ? sprintf(" (%.3f x off)", c[i] / off) : "" }'
}
for mode in $MODES; do
    printf '[batching]\nwindow_seconds = 60\n[reputation]\n%s\nepoch_seconds = %s\n' \
        "$(reputation_keys "$mode")" "$EPOCH" > "$WORK/instr-$mode.toml"
    echo "$mode $(count "$WORK/callgrind-replay-$mode.out" "$BIN" replay --config "$WORK/instr-$mode.toml" --input "$INPUT")"
done | ratios | sed 's/^/replay /'

if [ "${KAFKA:-0}" = 1 ]; then
    PORT="${BENCH_PORT:-19196}"
    BROKERS="127.0.0.1:$PORT"
    . scripts/kafka-bench-lib.sh
    HELPER="$(bench_exe kafka_passthrough)"
    trap 'broker_stop "$PORT"' EXIT
    TOTAL="$(grep -cv '^[[:space:]]*$' "$INPUT")"
    RUN="instr$$"
    for mode in $MODES; do
        broker_restart "$PORT" >/dev/null
        round="$RUN-$mode"
        group="$round-g"
        state="$WORK/state-$group"
        preload "$BIN" "$round" "$INPUT" at_least_once "$BROKERS" "$WORK" > /dev/null 2>&1
        # Polls 50× slower under callgrind: the group's timeouts are
        # raised so that it is not taken for dead.
        reputation_config "$round" "$group" "$state" "127.0.0.1:$((PORT + 100))" "$BROKERS" "$mode" "$EPOCH" \
            | sed 's/"6000"/"120000"/' > "$WORK/$group.toml"
        rm -rf "$state"
        out="$WORK/callgrind-run-$mode.out"
        valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" run --config "$WORK/$group.toml" \
            > "$out.log" 2>&1 &
        pid=$!
        "$HELPER" wait "$BROKERS" "$round-votes" "$group" "$TOTAL" > /dev/null
        kill -TERM "$pid"
        wait "$pid" || true
        rm -rf "$state"
        echo "$mode $(grep -o 'Collected : [0-9]*' "$out.log" | awk '{ print $3 }')"
    done | ratios | sed 's/^/run    /'
fi
