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
. scripts/lib.sh
N="${1:-1000000}"
ROUNDS="${2:-3}"
bench_votes "$N"
release_bin
CONFIG="$WORK/bench.toml"
printf '[batching]\nwindow_seconds = 60\n' > "$CONFIG"

cat "$INPUT" > /dev/null # warm the page cache
for _ in $(seq "$ROUNDS"); do
    time_rss replay "$BIN" replay --config "$CONFIG" --input "$INPUT"
    time_rss grid9 "$BIN" backtest --config "$CONFIG" --input "$INPUT" \
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
