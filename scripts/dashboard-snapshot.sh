#!/usr/bin/env bash
# A picture of the Grafana dashboard's panels with live data, made without
# Grafana (docs/walkthrough.md shows it):
#   scripts/dashboard-snapshot.sh [OUT.png]        (default docs/img/dashboard.png)
#
# Starts the test broker (tansu), `jurystream run` (2 partitions, learned
# reviewer reputation with one-minute epochs) and `jurystream connect`,
# and a Prometheus (Debian `prometheus`) scraping both every second; publishes
# examples/votes.jsonl with `jurystream produce` in slices a couple of
# seconds apart, then posts the Label Studio webhook bodies recorded in
# tests/fixtures/label-studio/ to connect; waits until run has scored
# everything and Prometheus holds the same counts; then runs every target of
# every panel of deploy/grafana/dashboards/*.json through Prometheus' HTTP API
# (scripts/dashboard_snapshot.py: query_range over the run, $model and
# $rubric = All, $__rate_interval as Grafana computes it), draws the panels on
# the dashboard's grid in one HTML page and screenshots it with headless
# Chromium. Prints each panel's outcome and where the PNG went. Fails when a
# panel query returns an error or no panel has data. Everything it started
# is stopped on exit. About two minutes.
#
# Environment:
#   JURYSTREAM_BIN             the jurystream binary (default: cargo build --release
#                              --locked --bins, then target/release/jurystream)
#   PROMETHEUS, CHROMIUM       the binaries (default: prometheus, chromium on PATH;
#                              scripts/install-deps.sh installs both)
#   SNAPSHOT_SLICES            slices the vote file is published in (default 20)
#   SNAPSHOT_PACE              seconds between slices (default 2). The example's
#                              votes are from 2024: a partition that gets no vote
#                              for idle_flush_seconds (20) moves its watermark to
#                              now, and every later vote of the file is late.
#   JURYSTREAM_SNAPSHOT_KEEP=1 keep the work directory (configs, logs, page.html,
#                              summary.json: every query and its series count)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
T0=$SECONDS

OUT="${1:-docs/img/dashboard.png}"
SLICES="${SNAPSHOT_SLICES:-20}"
PACE="${SNAPSHOT_PACE:-2}"
IDLE_FLUSH=20
PROMETHEUS="${PROMETHEUS:-prometheus}"
CHROMIUM="${CHROMIUM:-chromium}"

if [ -z "${JURYSTREAM_BIN:-}" ]; then
    step "building jurystream (cargo build --release; the first build takes long)"
    scripts/install-deps.sh --build
fi
release_bin
[ -x "$BIN" ] || die "no jurystream binary at $BIN"
command -v curl >/dev/null || die "needs curl"
command -v python3 >/dev/null || die "needs python3"
command -v "$PROMETHEUS" >/dev/null || die "needs prometheus (apt-get install prometheus, or scripts/install-deps.sh)"
command -v "$CHROMIUM" >/dev/null || die "needs chromium (apt-get install chromium, or scripts/install-deps.sh)"
scripts/broker.sh install

WORK="$(mktemp -d "${TMPDIR:-/tmp}/jurystream-snapshot.XXXXXX")"
BROKER_PORT="$(free_port 19100 19599)"
METRICS="127.0.0.1:$(free_port 19600 19799)"
CONNECT="127.0.0.1:$(free_port 19800 19999)"
PROM="127.0.0.1:$(free_port 20000 20199)"
CONNECT_TOKEN="snapshot-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"

RUN_PID="" CONNECT_PID="" PROM_PID="" BROKER_STARTED=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    echo "==> stopping everything [$((SECONDS - T0))s]"
    stop_pid "$PROM_PID"
    stop_pid "$CONNECT_PID"
    stop_pid "$RUN_PID"
    [ -z "$BROKER_STARTED" ] || broker_stop "$BROKER_PORT"
    if [ "$rc" -ne 0 ] || [ "${JURYSTREAM_SNAPSHOT_KEEP:-}" = 1 ]; then
        echo "    work directory kept: $WORK (run.log, connect.log, prometheus.log, page.html, summary.json)"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap_exit cleanup

step "starting the test broker (tansu) on 127.0.0.1:$BROKER_PORT"
BROKER_STARTED=1
scripts/broker.sh start "$BROKER_PORT" | sed 's/^/    /'

cat > "$WORK/jurystream.toml" <<TOML
# One-minute windows (the default). An idle partition closes its windows
# after $IDLE_FLUSH s (the last batches are scored then), longer than any
# pause between the slices: the example's votes are from 2024, and a flush
# moves the watermark to now.
[batching]
idle_flush_seconds = $IDLE_FLUSH
[metrics]
listen = "$METRICS"
[kafka]
brokers = "127.0.0.1:$BROKER_PORT"
group_id = "snapshot"
input_topics = ["votes"]
topic_partitions = 2
[kafka.properties]
"session.timeout.ms" = "6000"
"max.poll.interval.ms" = "6000"
[state]
dir = "$WORK/state"
# Learned reviewer weights with one-minute epochs: the example's half hour
# of votes fills the reputation panels (a batch of minute k is weighed with
# the tables of the minutes up to k - 2).
[reputation]
mode = "learned"
epoch_seconds = 60
prior_votes = 1
# connect: webhooks only (no label_studio.url: no sync, no routing).
[connect]
listen = "$CONNECT"
token = "$CONNECT_TOKEN"
TOML

step "starting Prometheus on $PROM (scrapes run and connect every second)"
# The job names of deploy/prometheus/prometheus.yml: the dashboard selects on them.
cat > "$WORK/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: jurystream
    static_configs:
      - targets: ["$METRICS"]
  - job_name: jurystream-connect
    static_configs:
      - targets: ["$CONNECT"]
YAML
"$PROMETHEUS" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prometheus-data" \
    --web.listen-address="$PROM" --log.level=warn > "$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
wait_http "http://$PROM/-/ready" 60 "$PROM_PID" "prometheus" "$WORK/prometheus.log"
START=$(date +%s)
step "starting jurystream run (metrics and query API on $METRICS)"
"$BIN" run --config "$WORK/jurystream.toml" > "$WORK/run.log" 2>&1 &
RUN_PID=$!
wait_http "http://$METRICS/readyz" 60 "$RUN_PID" "jurystream run" "$WORK/run.log"

step "starting jurystream connect on $CONNECT"
"$BIN" connect --config "$WORK/jurystream.toml" > "$WORK/connect.log" 2>&1 &
CONNECT_PID=$!
wait_http "http://$CONNECT/readyz" 60 "$CONNECT_PID" "jurystream connect" "$WORK/connect.log"

# until Prometheus has scraped both (run's counters start at 0 there); then
# the votes at once: a partition idle for idle_flush_seconds makes them late
deadline=$((SECONDS + 30))
targets_up() {
    curl -fsS "http://$PROM/api/v1/query" --data-urlencode 'query=sum(up)' 2>/dev/null \
        | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)' 2>/dev/null \
        || echo 0
}
until [ "$(targets_up)" = 2 ]; do
    [ $SECONDS -lt $deadline ] || die "Prometheus has not scraped run and connect after 30 s; log $WORK/prometheus.log"
    sleep 0.5
done

LINES=$(wc -l < examples/votes.jsonl)
PER=$(( (LINES + SLICES - 1) / SLICES ))
step "publishing examples/votes.jsonl ($LINES lines) in slices of $PER, ${PACE}s apart (jurystream produce)"
split -l "$PER" -d -a 3 examples/votes.jsonl "$WORK/slice-"
for f in "$WORK"/slice-*; do
    "$BIN" produce --input "$f" --topic votes --brokers "127.0.0.1:$BROKER_PORT" > /dev/null 2>> "$WORK/produce.log" \
        || { cat "$WORK/produce.log" >&2; die "jurystream produce failed"; }
    sleep "$PACE"
done

HOOKS=(tests/fixtures/label-studio/0*.json)
step "posting ${#HOOKS[@]} recorded Label Studio webhooks to http://$CONNECT/hooks/label-studio"
for f in "${HOOKS[@]}"; do
    curl -fsS -o /dev/null -X POST -H "Authorization: Bearer $CONNECT_TOKEN" \
        -H 'Content-Type: application/json' --data-binary "@$f" "http://$CONNECT/hooks/label-studio" \
        || die "connect refused $f; log $WORK/connect.log"
done

step "waiting until run has scored everything and Prometheus has the same counts"
python3 scripts/dashboard_snapshot.py settle --metrics "http://$METRICS" --prometheus "http://$PROM" \
    --quiet $((IDLE_FLUSH + 6)) --timeout 180
sleep 5
END=$(date +%s)

step "running every panel's queries (deploy/grafana/dashboards/*.json) over the run's $((END - START)) s"
python3 scripts/dashboard_snapshot.py render --prometheus "http://$PROM" --start "$START" --end "$END" \
    --scrape-interval 1 --out "$WORK/page.html" --summary "$WORK/summary.json" \
    deploy/grafana/dashboards/*.json | tee "$WORK/render.txt"
HEIGHT=$(sed -n 's/^height //p' "$WORK/render.txt")

step "screenshot with headless Chromium"
mkdir -p "$(dirname "$OUT")"
rm -f "$WORK/shot.png"
timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
    --force-device-scale-factor=1 --user-data-dir="$WORK/chromium" \
    --window-size="1200,$HEIGHT" --screenshot="$WORK/shot.png" "file://$WORK/page.html" \
    > "$WORK/chromium.log" 2>&1 || { tail -5 "$WORK/chromium.log" >&2; die "chromium failed"; }
[ -s "$WORK/shot.png" ] || die "chromium wrote no screenshot; log $WORK/chromium.log"
cp "$WORK/shot.png" "$OUT"
echo "==> $OUT: 1200 x $HEIGHT px, $(( $(stat -c %s "$OUT") / 1024 )) KiB [$((SECONDS - T0))s]"
