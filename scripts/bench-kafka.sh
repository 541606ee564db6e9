#!/usr/bin/env bash
# End-to-end Kafka benchmark: N votes preloaded on a 4-partition
# topic of the test broker; measures `jurystream run` from start until every
# input offset is committed, against a passthrough (consume -> produce ->
# flush -> commit, no scoring) on the same broker in the same run.
#   scripts/bench-kafka.sh [VOTES]     (default 1000000)
# Both sides use the at-least-once cycle (DELIVERY, default at_least_once; the
# figures in docs/PERFORMANCE.md were measured so). The test broker
# (scripts/broker.sh: the prebuilt tansu) commits Kafka transactions, so
# DELIVERY=exactly_once runs on it too, as on Apache Kafka.
# Also reports the commit latency (jurystream_commit_duration_seconds,
# scraped from the service's /metrics on METRICS_PORT, default 19299, just
# before it is stopped): commits, mean, and the p50 / p99 bucket bounds.
# JURYSTREAM_BIN=PATH measures that binary instead of the release build.
# For each side it also reports the CPU it cost: the side's own process,
# the broker's, and how busy the whole machine was (broker and benchmark
# share its cores), so a ratio below target can be read as "CPU-bound on
# this machine" or not.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N="${1:-1000000}"
DELIVERY="${DELIVERY:-at_least_once}"
PORT="${BENCH_PORT:-19192}"
bench_votes "$N"
BROKERS="127.0.0.1:$PORT"

. scripts/kafka-bench-lib.sh
release_bin
HELPER="$(bench_exe kafka_passthrough)"

broker_restart "$PORT"
trap 'broker_stop "$PORT"' EXIT
RUN="bench$$"
METRICS="127.0.0.1:${METRICS_PORT:-19299}"
service_config "$RUN" "$RUN-group" "$WORK/state-$RUN" "$METRICS" "$DELIVERY" "$BROKERS" > "$WORK/kafka.toml"
rm -rf "$WORK/state-$RUN"
preload "$BIN" "$RUN" "$INPUT" "$DELIVERY" "$BROKERS" "$WORK"
TOTAL="$(grep -cv '^[[:space:]]*$' "$INPUT")"

BROKER_PID="$(broker_pid "$PORT")"
# cpu_mark VAR: sets VAR to "BUSY TOTAL BROKER CHILDREN" in clock ticks: the
# machine's busy and total time (/proc/stat), the broker's CPU, and the CPU
# of this shell's waited-for children (`times`: run in this shell, not a
# subshell, which would see none of them).
cpu_mark() {
    local busy total broker children
    read -r busy total < <(awk '/^cpu /{t=0; for (i=2;i<=NF;i++) t+=$i; print t-$5-$6, t}' /proc/stat)
    broker=$(awk '{print $14 + $15}' "/proc/$BROKER_PID/stat")
    times > "$WORK/times.txt"
    children=$(awk -v k="$(getconf CLK_TCK)" 'NR==2{split($1,u,/[ms]/); split($2,s,/[ms]/); print (u[1]*60+u[2]+s[1]*60+s[2])*k}' "$WORK/times.txt")
    printf -v "$1" '%s %s %s %s' "$busy" "$total" "$broker" "$children"
}

# 1. passthrough baseline
cpu_mark P0
PASS_S="$("$HELPER" pass "$BROKERS" "$RUN-votes" "$RUN-pass-out" "$RUN-pass" "$TOTAL")"
cpu_mark P1
# 2. jurystream run
cpu_mark R0
START=$(date +%s.%N)
"$BIN" run --config "$WORK/kafka.toml" > "$WORK/run.log" 2>&1 &
PID=$!
"$HELPER" wait "$BROKERS" "$RUN-votes" "$RUN-group" "$TOTAL" > /dev/null
END=$(date +%s.%N)
cpu_mark R1
RUN_TICKS=$(awk '{print $14 + $15}' "/proc/$PID/stat")
curl -sf "http://$METRICS/metrics" > "$WORK/run-metrics.txt" || : > "$WORK/run-metrics.txt"
kill -TERM $PID; wait $PID || true
python3 - "$TOTAL" "$PASS_S" "$START" "$END" "$WORK/run-metrics.txt" "$(getconf CLK_TCK)" \
    "$P0" "$P1" "$R0" "$R1" "$RUN_TICKS" <<'PY'
import re, sys
n = int(sys.argv[1]); p = float(sys.argv[2]); r = float(sys.argv[4]) - float(sys.argv[3])
tck = float(sys.argv[6])
p0, p1, r0, r1 = ([float(x) for x in a.split()] for a in sys.argv[7:11])
def cpu(label, a, b, own):
    busy, total = b[0] - a[0], b[1] - a[1]
    print(f"  {label} CPU: {own / tck:.2f} s own, broker {(b[2] - a[2]) / tck:.2f} s, "
          f"machine {100 * busy / total:.0f} % busy")
print(f"passthrough: {p:.2f} s = {n/p:,.0f} votes/s")
cpu("passthrough", p0, p1, p1[3] - p0[3])
print(f"jurystream run: {r:.2f} s = {n/r:,.0f} votes/s")
cpu("run", r0, r1, float(sys.argv[11]))
print(f"ratio run / passthrough throughput: {p/r:.2f}")
name = "jurystream_commit_duration_seconds"
buckets, total, count = [], 0.0, 0
for line in open(sys.argv[5]):
    m = re.match(name + r'_bucket\{le="([^"]+)"\} (\S+)', line)
    if m:
        buckets.append((float(m.group(1)), float(m.group(2))))
    elif line.startswith(name + "_sum "):
        total = float(line.split()[1])
    elif line.startswith(name + "_count "):
        count = int(float(line.split()[1]))
def bound(q):
    for le, c in buckets:
        if c >= q * count:
            return "+Inf" if le == float("inf") else f"{le * 1000:g} ms"
if count:
    print(f"commit latency: {count} commits, mean {total / count * 1000:.1f} ms, "
          f"p50 <= {bound(0.5)}, p99 <= {bound(0.99)} (histogram bucket bounds)")
else:
    print("commit latency: not scraped (no /metrics answer)")
PY
