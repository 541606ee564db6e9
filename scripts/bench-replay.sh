#!/usr/bin/env bash
# Replay benchmark: a generated 1 000 000-vote file through
# `jurystream replay` (release build), next to a parse-only pass over the
# same file. Reports votes/s and peak RSS.
#   scripts/bench-replay.sh [VOTES]        (default 1000000)
# JURYSTREAM_BIN=PATH measures that binary instead of building one;
# BASELINE_BIN=PATH also measures an older build in the same runs, turn
# about (for before/after numbers on a shared machine).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N="${1:-1000000}"
bench_votes "$N"

release_bin
PARSE_BIN="$(bench_exe parse_only)"
CONFIG="$WORK/bench.toml"
printf '[batching]\nwindow_seconds = 60\n' > "$CONFIG"

# warm the page cache
cat "$INPUT" > /dev/null
for i in 1 2 3; do
    time_rss parse "$PARSE_BIN" "$INPUT"
    time_rss replay "$BIN" replay --config "$CONFIG" --input "$INPUT"
    if [ -n "${BASELINE_BIN:-}" ]; then
        time_rss baseline "$BASELINE_BIN" replay --config "$CONFIG" --input "$INPUT"
    fi
done | python3 -c '
import sys
n = int(sys.argv[1])
rows = {}
for line in sys.stdin:
    label, secs, kb = line.split()
    rows.setdefault(label, []).append((float(secs), int(kb)))
for label, rs in rows.items():
    best = min(r[0] for r in rs)
    rss = max(r[1] for r in rs) / 1024
    print(f"{label:7s} best of {len(rs)}: {best:.2f} s = {n / best:,.0f} lines/s, peak RSS {rss:.0f} MiB")
p = min(r[0] for r in rows["parse"]); r = min(r[0] for r in rows["replay"])
print(f"replay / parse-only time ratio: {r / p:.2f}")
if "baseline" in rows:
    b = min(x[0] for x in rows["baseline"])
    print(f"replay / baseline time ratio: {r / b:.3f}")
' "$N"
wc -l < "$WORK/replay.out" | xargs echo "events printed:"
