# Shared by the Kafka benchmarks (bench-kafka.sh, bench-query.sh,
# bench-peer.sh); sourced from the repository root, after scripts/lib.sh.

# service_config RUN GROUP STATE_DIR LISTEN DELIVERY BROKERS: a `jurystream
# run` configuration for input topic RUN-votes (4 partitions) and outputs
# RUN-scores, RUN-flags, RUN-dlq. COMMIT_INTERVAL_MS, when set, sets
# kafka.commit_interval_ms (otherwise the default).
service_config() {
    cat <<TOML
[batching]
idle_flush_seconds = 5
[outputs]
scores_topic = "$1-scores"
flags_topic = "$1-flags"
dlq_topic = "$1-dlq"
[metrics]
listen = "$4"
[kafka]
brokers = "$6"
group_id = "$2"
input_topics = ["$1-votes"]
topic_partitions = 4
delivery = "$5"
${COMMIT_INTERVAL_MS:+commit_interval_ms = $COMMIT_INTERVAL_MS}
[kafka.properties]
"session.timeout.ms" = "6000"
"max.poll.interval.ms" = "6000"
[state]
dir = "$3"
TOML
}

# reputation_config RUN GROUP STATE_DIR LISTEN BROKERS MODE EPOCH_SECONDS:
# service_config (at_least_once) with 60 s windows and contract §14's
# reputation in MODE, its topic GROUP-reputation (bench-reputation.sh,
# bench-instructions.sh).
reputation_config() {
    service_config "$1" "$2" "$3" "$4" at_least_once "$5" \
        | sed 's/^\[batching\]$/[batching]\nwindow_seconds = 60/'
    printf '[reputation]\n%s\nepoch_seconds = %s\ntopic = "%s-reputation"\n' "$(reputation_keys "$6")" "$7" "$2"
}

# preload BIN RUN INPUT DELIVERY BROKERS WORK: the service's topics first
# (a 20 s start that creates them), then INPUT produced to RUN-votes. That
# start uses a group and state of its own: with the measured group, its
# idle flush would move the group's watermark to the wall clock, and the
# measured run (restoring it) would reject every vote of the file as late.
preload() {
    service_config "$2" "$2-setup" "$6/state-$2-setup" 127.0.0.1:0 "$4" "$5" > "$6/$2-setup.toml"
    timeout 20 "$1" run --config "$6/$2-setup.toml" > /dev/null 2>&1 || true
    rm -rf "$6/state-$2-setup" "$6/$2-setup.toml"
    "$1" produce --input "$3" --topic "$2-votes" --brokers "$5"
}

# wait_ready LISTEN: until the service at LISTEN has its 4 partitions
# assigned and restored (at most 60 s).
wait_ready() {
    for _ in $(seq 600); do
        if curl -sf "http://$1/metrics" 2>/dev/null \
            | awk '/^jurystream_partition_ready\{/ {n += $2} END {exit !(n == 4)}'; then
            return 0
        fi
        sleep 0.1
    done
}

# quix_venv: sets VENV to $WORK/quix-venv, a virtualenv with Quix Streams
# (pinned) installed there when it is missing or another version.
quix_venv() {
    local version=3.28.1
    VENV="$WORK/quix-venv"
    if ! "$VENV/bin/python" -c "import quixstreams as q; assert q.__version__ == '$version'" 2>/dev/null; then
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install --quiet "quixstreams==$version"
    fi
}
