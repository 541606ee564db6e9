#!/usr/bin/env bash
# Backtest benchmark: a 9-point grid (3 λ × 3 windows) over the
# generated 1 000 000-vote file of bench-replay.sh, against one `replay` of
# the same file (events to /dev/null), in the same run, turn about.
# Target: the grid in under 3x the replay's time. Reports wall time and
# peak RSS of each.
#   scripts/bench-backtest.sh [VOTES] [ROUNDS]     (defaults 1000000, 3)
# JURYSTREAM_BIN=PATH measures that binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000000}"
ROUNDS="${2:-3}"
WORK="${BENCH_DIR:-${TMPDIR:-/tmp}/jurystream-bench}"
mkdir -p "$WORK"
INPUT="$WORK/votes-$N.jsonl"
[ -f "$INPUT" ] || python3 scripts/gen-votes.py --votes "$N" --out "$INPUT"
TARGET="${CARGO_TARGET_DIR:-target}"
BIN="${JURYSTREAM_BIN:-$TARGET/release/jurystream}"
[ -n "${JURYSTREAM_BIN:-}" ] || cargo build --release --locked --bins
CONFIG="$WORK/bench.toml"
printf '[batching]\nwindow_seconds = 60\n' > "$CONFIG"

measure() { # label cmd...
    local label="$1"; shift
    /usr/bin/time -f "%e %M" -o "$WORK/time.txt" "$@" > "$WORK/$label.out" 2> "$WORK/$label.err"
    read -r secs kb < "$WORK/time.txt"
    echo "$label $secs $kb"
}

cat "$INPUT" > /dev/null # warm the page cache
for _ in $(seq "$ROUNDS"); do
    measure replay "$BIN" replay --config "$CONFIG" --input "$INPUT"
    measure grid9 "$BIN" backtest --config "$CONFIG" --input "$INPUT" \
        --lambda 0.001,0.01,0.1 --window 30,60,300 --format json
done | python3 -c '
import sys
rows = {}
for line in sys.stdin:
    label, secs, kb = line.split()
    rows.setdefault(label, []).append((float(secs), int(kb)))
for label, rs in rows.items():
    times = ", ".join(f"{r[0]:.2f}" for r in rs)
    print(f"{label:7s} {times} s; best {min(r[0] for r in rs):.2f} s, peak RSS {max(r[1] for r in rs) / 1024:.0f} MiB")
r = min(x[0] for x in rows["replay"]); g = min(x[0] for x in rows["grid9"])
print(f"9-point grid / one replay (best of each): {g / r:.2f} (target < 3)")
'
head -c 400 "$WORK/grid9.out"; echo
