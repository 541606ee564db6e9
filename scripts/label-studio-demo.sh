#!/usr/bin/env bash
# jurystream with Label Studio, the whole loop on this machine:
#   scripts/label-studio-demo.sh
#
# Starts the test broker (tansu), a fresh Label Studio 1.23.2 (installed
# once into a venv by scripts/label-studio.sh, ~1 GB), `jurystream run` and
# `jurystream connect`; creates a project from examples/label-studio/
# (label config and 4 tasks) whose webhook points at connect; three
# reviewers annotate every task (one task disputed, one annotation edited,
# one task skipped); then waits until run has scored every series and
# connect has sent the disputed task back to Label Studio for more reviews,
# and prints the scores, the flags and the disputed task as Label Studio now
# serves it. Everything it started is stopped on exit. About a minute
# once Label Studio is installed (its first start on a fresh data directory
# migrates a database: 35-80 s of that).
#
# Environment:
#   JURYSTREAM_BIN          the jurystream binary (default: cargo build --release
#                           --locked --bins, then target/release/jurystream)
#   JURYSTREAM_DEMO_KEEP=1  keep the work directory (configs, logs, events)
#   JURYSTREAM_DEMO_TIMEOUT seconds to wait for scores and routing (default 90)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
T0=$SECONDS

if [ -z "${JURYSTREAM_BIN:-}" ]; then
    step "building jurystream (cargo build --release; the first build takes long)"
    scripts/install-deps.sh --build
fi
release_bin
[ -x "$BIN" ] || die "no jurystream binary at $BIN"
"$BIN" connect --help >/dev/null 2>&1 || die "$BIN has no 'connect' command (build a newer jurystream)"
command -v curl >/dev/null || die "needs curl"
scripts/broker.sh install
scripts/label-studio.sh install

WORK="$(mktemp -d "${TMPDIR:-/tmp}/jurystream-ls-demo.XXXXXX")"
LS_PORT="$(free_port 18000 18999)"
BROKER_PORT="$(free_port 19100 19599)"
METRICS="127.0.0.1:$(free_port 19600 19799)"
CONNECT="127.0.0.1:$(free_port 19800 19999)"
CONNECT_TOKEN="demo-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
WINDOW=10

LS_START_PID="" RUN_PID="" CONNECT_PID="" CONSUME_PID="" BROKER_STARTED="" LS_STARTED=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    echo "==> stopping everything [$((SECONDS - T0))s]"
    stop_pid "$CONSUME_PID"
    stop_pid "$CONNECT_PID"
    stop_pid "$RUN_PID"
    stop_pid "$LS_START_PID"
    [ -z "$LS_STARTED" ] || scripts/label-studio.sh stop "$LS_PORT" >/dev/null 2>&1 || true
    [ -z "$BROKER_STARTED" ] || broker_stop "$BROKER_PORT"
    if [ "$rc" -ne 0 ] || [ "${JURYSTREAM_DEMO_KEEP:-}" = 1 ]; then
        echo "    logs and events kept in $WORK (run.log, connect.log, label-studio/, events.jsonl)"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap_exit cleanup

step "starting Label Studio on 127.0.0.1:$LS_PORT (fresh data directory: the first start migrates its database, 35-80 s)"
LS_STARTED=1
scripts/label-studio.sh start "$LS_PORT" "$WORK/label-studio" > "$WORK/label-studio-start.log" 2>&1 &
LS_START_PID=$!

step "starting the test broker (tansu) on 127.0.0.1:$BROKER_PORT"
BROKER_STARTED=1
scripts/broker.sh start "$BROKER_PORT" | sed 's/^/    /'
eval "$(scripts/label-studio.sh env "$LS_PORT")"

cat > "$WORK/jurystream.toml" <<TOML
# Scores within seconds: 10 s windows, 1 s grace, and an idle partition
# closes its windows after 2 s.
[batching]
window_seconds = $WINDOW
grace_seconds = 1
idle_flush_seconds = 2
[metrics]
listen = "$METRICS"
[kafka]
brokers = "127.0.0.1:$BROKER_PORT"
group_id = "ls-demo"
input_topics = ["votes"]
topic_partitions = 1
# the default delivery, exactly_once: the test broker (the prebuilt tansu)
# commits Kafka transactions, as Kafka and Redpanda do
[kafka.properties]
"session.timeout.ms" = "6000"
"max.poll.interval.ms" = "6000"
[state]
dir = "$WORK/state"
# Learned reviewer weights with epochs of one window, so that the tasks
# reviewed later are scored with tables of the earlier ones (a batch of
# epoch k uses the epochs up to k - 2); one prior vote so that a few
# reviews move a weight visibly.
[reputation]
mode = "learned"
epoch_seconds = $WINDOW
prior_votes = 1
[connect]
listen = "$CONNECT"
token = "$CONNECT_TOKEN"
[label_studio]
url = "$LS_URL"
token = "$LS_TOKEN"
# Re-read recently updated annotations every 5 s (longer than the idle
# flush: the re-read votes are records too).
sync_interval_seconds = 5
sync_lookback_seconds = 600
extra_reviews = 2
max_annotations = 10
TOML

step "starting jurystream run (metrics and query API on $METRICS)"
"$BIN" run --config "$WORK/jurystream.toml" > "$WORK/run.log" 2>&1 &
RUN_PID=$!
wait_http "http://$METRICS/readyz" 60 "$RUN_PID" "jurystream run" "$WORK/run.log"
# Every score and flag event, as it is committed.
"$BIN" consume --brokers "127.0.0.1:$BROKER_PORT" --topic jury.scores --topic jury.flags \
    > "$WORK/events.jsonl" 2> "$WORK/consume.log" &
CONSUME_PID=$!

next=$((SECONDS + 10))
while kill -0 "$LS_START_PID" 2>/dev/null; do
    if [ $SECONDS -ge $next ]; then
        echo "    ... Label Studio still starting ($((SECONDS - T0))s)"
        next=$((SECONDS + 10))
    fi
    sleep 0.5
done
wait "$LS_START_PID" || { cat "$WORK/label-studio-start.log" >&2; LS_START_PID=""; die "Label Studio did not start"; }
LS_START_PID=""
sed 's/^/    /' "$WORK/label-studio-start.log" | head -1

step "starting jurystream connect on $CONNECT (webhook: POST http://$CONNECT/hooks/label-studio)"
"$BIN" connect --config "$WORK/jurystream.toml" > "$WORK/connect.log" 2>&1 &
CONNECT_PID=$!
wait_http "http://$CONNECT/readyz" 60 "$CONNECT_PID" "jurystream connect" "$WORK/connect.log"

python3 scripts/label_studio_demo.py \
    --ls-url "$LS_URL" --ls-token "$LS_TOKEN" \
    --connect "http://$CONNECT" --connect-token "$CONNECT_TOKEN" \
    --api "http://$METRICS" --events "$WORK/events.jsonl" \
    --window "$WINDOW" --timeout "${JURYSTREAM_DEMO_TIMEOUT:-90}" --elapsed $((SECONDS - T0))
echo "==> done in $((SECONDS - T0))s"
