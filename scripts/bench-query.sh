#!/usr/bin/env bash
# Query API under load: point lookups (GET /v1/inferences/{id})
# against `jurystream run` while it processes votes, and the vote
# throughput that costs.
#   scripts/bench-query.sh [VOTES]     (default 1000000)
# N votes are preloaded on a 4-partition topic of the test broker (as in
# scripts/bench-kafka.sh, at-least-once unless DELIVERY says otherwise).
# Each round runs, on that same topic, with a fresh group and state dir:
#   baseline  `jurystream run`, no queries;
#   loaded    `jurystream run`, and from LOAD_START_PCT % (default 22) of
#             the input committed until 100 %, benches/query_load.rs at RATE
#             req/s (default 20000, CONNECTIONS default 32) on its metrics
#             port, ids from the first 20 % of the vote file (already
#             scored, unless a partition lags behind the others); then,
#             with everything committed (idle), each of IDLE_RATES (default
#             "RATE 40000 10000 5000 2000") req/s for IDLE_SECONDS (default
#             20), the leaderboard at 1000/s for 5 s, and /healthz at
#             40000/s for 10 s (the HTTP stack alone).
# Vote throughput = votes committed between 25 % and 100 % / that time
# (kafka_passthrough `mark`: polled every 20 ms). ROUNDS (default 2) rounds,
# baseline and loaded interleaved. CPU of the service (and of its
# metrics-http thread), the broker and the load generator is read from /proc
# over the 25 %→100 % interval. Results: $WORK/query-*.json*, summary on stdout.
# JURYSTREAM_BIN=PATH measures that binary instead of the release build (not
# rebuilt then; the two bench helpers are).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N="${1:-1000000}"
ROUNDS="${ROUNDS:-2}"
RATE="${RATE:-20000}"
IDLE_RATES="${IDLE_RATES:-$RATE 40000 10000 5000 2000}"
CONNECTIONS="${CONNECTIONS:-32}"
IDLE_SECONDS="${IDLE_SECONDS:-20}"
LOAD_START_PCT="${LOAD_START_PCT:-22}"
DELIVERY="${DELIVERY:-at_least_once}"
PORT="${BENCH_PORT:-19192}"
HTTP_PORT="${BENCH_HTTP_PORT:-19464}"
bench_votes "$N"
BROKERS="127.0.0.1:$PORT"
URL="http://127.0.0.1:$HTTP_PORT"

release_bin
. scripts/kafka-bench-lib.sh
HELPER="$(bench_exe kafka_passthrough)"
LOAD="$(bench_exe query_load)"

SVC_PID=""
LOAD_PID=""
STATES=()
cleanup() {
    [ -n "$LOAD_PID" ] && kill -TERM "$LOAD_PID" 2>/dev/null || true
    [ -n "$SVC_PID" ] && kill -TERM "$SVC_PID" 2>/dev/null && wait "$SVC_PID" 2>/dev/null || true
    for s in "${STATES[@]}"; do rm -rf "$s"; done
    broker_stop "$PORT"
}
broker_restart "$PORT"
trap cleanup EXIT
BROKER_PID="$(broker_pid "$PORT")"
RUN="query$$"

# config GROUP STATE_DIR > file
config() {
    service_config "$RUN" "$1" "$2" "127.0.0.1:$HTTP_PORT" "$DELIVERY" "$BROKERS"
}

preload "$BIN" "$RUN" "$INPUT" "$DELIVERY" "$BROKERS" "$WORK"
TOTAL="$(grep -cv '^[[:space:]]*$' "$INPUT")"
Q25=$(( (TOTAL + 3) / 4 ))
QSTART=$(( (TOTAL * LOAD_START_PCT + 99) / 100 ))

# Ids of the first 20 % of the votes (valid ids only: bad lines carry
# made-up ones), first occurrence order.
IDS="$WORK/query-ids-$N.txt"
python3 - "$INPUT" "$TOTAL" "$IDS" <<'PY'
import json, re, sys
inp, total, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ok = re.compile(r"^inf-\d{7}$")
seen = {}
with open(inp) as f:
    for i, line in enumerate(f):
        if i >= total // 5:
            break
        try:
            v = json.loads(line)
        except ValueError:
            continue
        if isinstance(v, dict) and isinstance(v.get("inference_id"), str) and ok.match(v["inference_id"]):
            seen.setdefault(v["inference_id"], None)
with open(out, "w") as f:
    f.write("\n".join(seen) + "\n")
print(f"query ids: {len(seen)} from the first {total // 5} lines", file=sys.stderr)
PY

RESULTS="$WORK/query-results-$RUN.jsonl"
: > "$RESULTS"
CLK_TCK="$(getconf CLK_TCK)"

# ticks PID: utime + stime of a process (0 if gone).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# http_ticks PID: the same for the service's metrics-http thread.
http_ticks() {
    grep -l '^metrics-http$' /proc/"$1"/task/*/comm 2>/dev/null \
        | while read -r c; do awk '{print $14 + $15}' "${c%comm}stat"; done \
        | awk '{s += $1} END {print s + 0}'
}
# busy: busy and total jiffies of the whole machine.
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9 " " $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }

# measure MODE ROUND: one run; appends a JSON line to $RESULTS.
measure() {
    local mode="$1" round="$2"
    local group="$RUN-$mode-$round"
    local state="$WORK/state-$group"
    local out="$WORK/query-$group"
    rm -rf "$state" "$out".*
    STATES+=("$state")
    config "$group" "$state" > "$out.toml"
    "$BIN" run --config "$out.toml" > "$out.log" 2>&1 &
    SVC_PID=$!
    "$HELPER" mark "$BROKERS" "$RUN-votes" "$group" "$QSTART" > /dev/null
    if [ "$mode" = loaded ]; then
        # Runs until stopped at 100 % (the duration is only a bound).
        "$LOAD" "$URL" "$IDS" "$RATE" 3600 "$CONNECTIONS" --label "loaded, round $round" \
            > "$out.load.json" &
        LOAD_PID=$!
    fi
    local at25 at100
    read -r at25 < <("$HELPER" mark "$BROKERS" "$RUN-votes" "$group" "$Q25")
    at25="$at25 $(ticks $SVC_PID) $(http_ticks $SVC_PID) $(ticks "$BROKER_PID") $([ -n "$LOAD_PID" ] && ticks "$LOAD_PID" || echo 0) $(busy)"
    read -r at100 < <("$HELPER" mark "$BROKERS" "$RUN-votes" "$group" "$TOTAL")
    at100="$at100 $(ticks $SVC_PID) $(http_ticks $SVC_PID) $(ticks "$BROKER_PID") $([ -n "$LOAD_PID" ] && ticks "$LOAD_PID" || echo 0) $(busy)"
    if [ -n "$LOAD_PID" ]; then
        kill -TERM "$LOAD_PID"
        wait "$LOAD_PID" || true
        LOAD_PID=""
    fi
    : > "$out.idle.jsonl"
    if [ "$mode" = loaded ]; then
        # Everything is committed: the instance only answers queries now.
        local r h0 j
        for r in $IDLE_RATES; do
            h0=$(http_ticks $SVC_PID)
            j="$("$LOAD" "$URL" "$IDS" "$r" "$IDLE_SECONDS" "$CONNECTIONS" --label "idle, $r/s")"
            echo "{\"load\": $j, \"http_cpu_s\": $(( $(http_ticks $SVC_PID) - h0 )).0e0}" >> "$out.idle.jsonl"
        done
        # One leaderboard sample (not a target).
        j="$("$LOAD" "$URL" - 1000 5 4 --leaderboard --label "idle, leaderboard 1000/s")"
        echo "{\"load\": $j}" >> "$out.idle.jsonl"
        # The HTTP stack alone (no state read): the floor under a lookup.
        h0=$(http_ticks $SVC_PID)
        j="$("$LOAD" "$URL" - 40000 10 "$CONNECTIONS" --path /healthz --label "idle, /healthz 40000/s")"
        echo "{\"load\": $j, \"http_cpu_s\": $(( $(http_ticks $SVC_PID) - h0 )).0e0}" >> "$out.idle.jsonl"
    fi
    kill -TERM $SVC_PID
    wait $SVC_PID || true
    SVC_PID=""
    rm -rf "$state"
    python3 - "$RESULTS" "$mode" "$round" "$CLK_TCK" "$out" "$at25" "$at100" <<'PY'
import json, os, sys
res, mode, rnd, tck, out, a, b = sys.argv[1:]
tck = float(tck)
a = [float(x) for x in a.split()]
b = [float(x) for x in b.split()]
d = b[0] - a[0]
row = dict(mode=mode, round=int(rnd), t25=a[0], c25=int(a[1]), t100=b[0], c100=int(b[1]),
           svc_cpu_s=(b[2] - a[2]) / tck, http_cpu_s=(b[3] - a[3]) / tck,
           broker_cpu_s=(b[4] - a[4]) / tck, load_cpu_s=(b[5] - a[5]) / tck,
           machine_busy=(b[6] - a[6]) / max(1.0, b[7] - a[7]))
row["load"] = json.load(open(out + ".load.json")) if os.path.exists(out + ".load.json") else None
row["idle"] = [json.loads(l) for l in open(out + ".idle.jsonl") if l.strip()]
for i in row["idle"]:
    if "http_cpu_s" in i:
        i["http_cpu_s"] /= tck
log = open(out + ".log", errors="replace").read().splitlines()
row["log_warn_error"] = [l for l in log if (" WARN " in l or " ERROR " in l) and "CONFWARN" not in l][:20]
with open(res, "a") as f:
    f.write(json.dumps(row) + "\n")
print(f"{mode} round {rnd}: {row['c100'] - row['c25']} votes (committed {row['c25']} -> {row['c100']}) "
      f"in {d:.3f} s = {(row['c100'] - row['c25']) / max(d, 1e-9):,.0f} votes/s", file=sys.stderr)
PY
}

for round in $(seq 1 "$ROUNDS"); do
    measure baseline "$round"
    measure loaded "$round"
done

python3 - "$RESULTS" "$TOTAL" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
total = int(sys.argv[2])
print(f"\n{total} votes, 4 partitions; vote throughput over 25 %→100 % committed")
print(f"{'run':<18}{'votes':>9}{'time s':>9}{'votes/s':>10}{'svc cpu':>9}{'http thr':>9}{'broker':>8}{'loadgen':>8}{'machine':>8}")
def rate(r): return (r["c100"] - r["c25"]) / max(1e-9, r["t100"] - r["t25"])
for r in rows:
    dt = max(1e-9, r["t100"] - r["t25"])
    print(f"{r['mode'] + ' ' + str(r['round']):<18}{r['c100'] - r['c25']:>9}{dt:>9.2f}{rate(r):>10,.0f}"
          f"{r['svc_cpu_s'] / dt:>9.2f}{r['http_cpu_s'] / dt:>9.2f}{r['broker_cpu_s'] / dt:>8.2f}"
          f"{r['load_cpu_s'] / dt:>8.2f}{r['machine_busy'] * 100:>7.0f}%")
print("(cpu columns: cores used over the interval; machine: busy share of both cores)")
rounds = sorted({r["round"] for r in rows})
for k in rounds:
    b = [r for r in rows if r["round"] == k and r["mode"] == "baseline"]
    l = [r for r in rows if r["round"] == k and r["mode"] == "loaded"]
    if b and l and rate(b[0]) > 0:
        print(f"round {k}: loaded / baseline vote throughput {rate(l[0]) / rate(b[0]):.3f} "
              f"(drop {100 * (1 - rate(l[0]) / rate(b[0])):.1f} %)")
def show(j):
    s = j["status"]
    return (f"{j['label']:<22} target {j['target_rps']:>7,.0f} achieved {j['achieved_rps']:>7,.0f} req/s  "
            f"p50 {j['p50_ms']} p90 {j['p90_ms']} p99 {j['p99_ms']} p99.9 {j['p999_ms']} max {j['max_ms']} ms  "
            f"200:{s['200']} 404:{s['404']} 503:{s['503']} other:{s['other']} errors:{j['errors']} "
            f"unsent:{j['unsent']} reconnects:{j['reconnects']} loadgen cpu {j['generator_cpu_s']} s")
print("\nqueries (latency from the scheduled send time)")
for r in rows:
    if r["load"]:
        print(show(r["load"]))
    for i in r["idle"]:
        extra = ""
        if "http_cpu_s" in i:
            extra = f"  metrics-http thread {i['http_cpu_s'] / i['load']['elapsed_s']:.2f} cores"
        print(show(i["load"]) + extra)
    for l in r["log_warn_error"]:
        print(f"  {r['mode']} {r['round']} log: {l}")
print(f"\nraw: {sys.argv[1]}")
PY
