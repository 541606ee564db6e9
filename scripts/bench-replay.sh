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
N="${1:-1000000}"
WORK="${BENCH_DIR:-${TMPDIR:-/tmp}/jurystream-bench}"
mkdir -p "$WORK"
INPUT="$WORK/votes-$N.jsonl"
[ -f "$INPUT" ] || python3 scripts/gen-votes.py --votes "$N" --out "$INPUT"
TARGET="${CARGO_TARGET_DIR:-target}"

BIN="${JURYSTREAM_BIN:-$TARGET/release/jurystream}"
[ -n "${JURYSTREAM_BIN:-}" ] || cargo build --release --locked --bins
PARSE_BIN="$(cargo bench --locked --bench parse_only --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "parse_only" and m.get("executable"):
        print(m["executable"])')"
CONFIG="$WORK/bench.toml"
printf '[batching]\nwindow_seconds = 60\n' > "$CONFIG"

measure() { # label cmd...
    local label="$1"; shift
    /usr/bin/time -f "%e %M" -o "$WORK/time.txt" "$@" > "$WORK/$label.out" 2> "$WORK/$label.err"
    read -r secs kb < "$WORK/time.txt"
    echo "$label $secs $kb"
}

# warm the page cache
cat "$INPUT" > /dev/null
for i in 1 2 3; do
    measure parse "$PARSE_BIN" "$INPUT"
    measure replay "$BIN" replay --config "$CONFIG" --input "$INPUT"
    if [ -n "${BASELINE_BIN:-}" ]; then
        measure baseline "$BASELINE_BIN" replay --config "$CONFIG" --input "$INPUT"
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
