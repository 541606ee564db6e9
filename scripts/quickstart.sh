#!/usr/bin/env bash
# The main job on the bundled example, end to end on this machine:
# builds jurystream, starts the test broker (tansu) on loopback, runs
# `jurystream run`, publishes examples/votes.jsonl, prints the score and flag
# events as they arrive and a few lines of /metrics, then stops everything.
# Fails when no score_updated event arrives.
#   scripts/quickstart.sh
# Environment: JURYSTREAM_BIN, the jurystream binary (default: the release
# build the README's command makes, built here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
PORT="${QUICKSTART_PORT:-19093}"
METRICS="127.0.0.1:${QUICKSTART_METRICS_PORT:-19464}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/jurystream-quickstart.XXXXXX")"

[ -n "${JURYSTREAM_BIN:-}" ] || scripts/install-deps.sh --build
release_bin
command -v curl >/dev/null || die "needs curl"
scripts/broker.sh install
scripts/broker.sh start "$PORT"
PID=""
cleanup() {
    [ -n "$PID" ] && kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
    broker_stop "$PORT"
    rm -rf "$WORK"
}
trap cleanup EXIT

cat > "$WORK/config.toml" <<TOML
[batching]
idle_flush_seconds = 3
[metrics]
listen = "$METRICS"
[kafka]
brokers = "127.0.0.1:$PORT"
group_id = "quickstart"
input_topics = ["votes"]
topic_partitions = 2
# the default delivery, exactly_once: the test broker (the prebuilt tansu)
# commits Kafka transactions, as Kafka and Redpanda do
[kafka.properties]
"session.timeout.ms" = "6000"
"max.poll.interval.ms" = "6000"
[state]
dir = "$WORK/state"
TOML

"$BIN" run --config "$WORK/config.toml" 2> "$WORK/run.log" &
PID=$!
# wait until the service is ready (topics created, partitions restored)
for _ in $(seq 1 150); do
    curl -fs "http://$METRICS/readyz" >/dev/null 2>&1 && break
    sleep 0.2
done
"$BIN" produce --input examples/votes.jsonl --topic votes --brokers "127.0.0.1:$PORT"
echo "--- score_updated and ambiguity_flagged events (jury.scores, jury.flags):"
"$BIN" consume --brokers "127.0.0.1:$PORT" --topic jury.scores --topic jury.flags --idle-exit 12 \
    | tee "$WORK/events.jsonl"
SCORES=$(grep -c '"type":"score_updated"' "$WORK/events.jsonl" || true)
echo "--- $SCORES score_updated events"
if [ "$SCORES" -eq 0 ]; then
    echo "quickstart: no score_updated event; the service's log:" >&2
    tail -30 "$WORK/run.log" >&2
    exit 1
fi
echo "--- a few lines of http://$METRICS/metrics:"
curl -fs "http://$METRICS/metrics" | grep -E '^jurystream_(votes_accepted_total|votes_rejected_total|score_updates_total|ambiguity_flags_total)' | head -12 || true
echo "--- stopping"
