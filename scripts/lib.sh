# shellcheck shell=bash
# Shared by the scripts of scripts/: functions only (sourcing it runs
# nothing). The scripts that change to the repository root source it as
# `. scripts/lib.sh`; the functions that call other scripts expect to run
# from there.

# step MESSAGE: "==> MESSAGE [Ns]", N the seconds since T0 (the script's
# $SECONDS at its start).
step() { printf '==> %s [%ds]\n' "$*" $((SECONDS - T0)); }

# die MESSAGE: MESSAGE on stderr after the script's name, then exit 1.
die() { echo "$(basename "$0" .sh): $*" >&2; exit 1; }

# free_port LO HI: a port in LO..HI nothing listens on.
free_port() {
    local lo=$1 hi=$2 p
    for _ in $(seq 1 200); do
        p=$((lo + RANDOM % (hi - lo + 1)))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
    done
    die "no free port in $lo-$hi"
}

# any_free_port: a port on 127.0.0.1 the kernel finds free.
any_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_http URL SECONDS PID WHAT LOG: polls URL until it answers 2xx, for at
# most SECONDS, while PID lives; else dies with the end of LOG.
wait_http() {
    local url=$1 seconds=$2 pid=$3 what=$4 log=$5
    local deadline=$((SECONDS + seconds))
    until curl -fsS -o /dev/null "$url" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || { tail -20 "$log" >&2; die "$what exited; log $log"; }
        [ $SECONDS -lt $deadline ] || { tail -20 "$log" >&2; die "$what not ready after ${seconds}s; log $log"; }
        sleep 0.2
    done
}

# stop_pid PID: TERM, up to 10 s, then KILL (nothing when PID is empty or
# gone).
stop_pid() {
    local pid=$1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# trap_exit FUNCTION: FUNCTION runs on exit, and Ctrl-C or a TERM exits
# (130, 143) through it.
trap_exit() {
    # shellcheck disable=SC2064 # FUNCTION's name, now
    trap "$1" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# release_bin: sets BIN to the jurystream binary: $JURYSTREAM_BIN when it
# is set, else the release build (cargo build --release --locked --bins) in
# ${CARGO_TARGET_DIR:-target}.
release_bin() {
    if [ -n "${JURYSTREAM_BIN:-}" ]; then
        BIN="$JURYSTREAM_BIN"
    else
        cargo build --release --locked --bins
        # shellcheck disable=SC2034 # for the caller
        BIN="${CARGO_TARGET_DIR:-target}/release/jurystream"
    fi
}

# bench_exe NAME: builds bench target NAME (release) and prints its path.
bench_exe() {
    cargo bench --locked --bench "$1" --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$1"
}

# bench_votes N: sets WORK, the benchmarks' work directory ($BENCH_DIR,
# default $TMPDIR/jurystream-bench; created), and INPUT, the N-vote file of
# scripts/gen-votes.py in it (generated when missing).
bench_votes() {
    WORK="${BENCH_DIR:-${TMPDIR:-/tmp}/jurystream-bench}"
    mkdir -p "$WORK"
    INPUT="$WORK/votes-$1.jsonl"
    [ -f "$INPUT" ] || python3 scripts/gen-votes.py --votes "$1" --out "$INPUT"
}

# time_rss LABEL CMD...: runs CMD (stdout to $WORK/LABEL.out, stderr to
# $WORK/LABEL.err) and prints "LABEL WALL_SECONDS PEAK_RSS_KB".
time_rss() {
    local label="$1" secs kb; shift
    /usr/bin/time -f "%e %M" -o "$WORK/time.txt" "$@" > "$WORK/$label.out" 2> "$WORK/$label.err"
    read -r secs kb < "$WORK/time.txt"
    echo "$label $secs $kb"
}

# broker_stop PORT: stops the test broker on PORT, if one runs there.
broker_stop() { scripts/broker.sh stop "$1" >/dev/null 2>&1 || true; }

# broker_restart PORT: a fresh test broker on PORT (one already there is
# stopped first).
broker_restart() {
    broker_stop "$1"
    scripts/broker.sh start "$1"
}

# broker_pid PORT: the process id of the test broker on PORT.
broker_pid() { cat "${JURYSTREAM_BROKER_DIR:-${TMPDIR:-/tmp}/jurystream-broker}/tansu-$1.pid"; }

# pinned_venv NAME WHAT VENV REQUIREMENTS: a fresh virtualenv at VENV (its
# parent directory created) with pip's REQUIREMENTS file installed;
# "NAME: installing WHAT into VENV (pip)" first. Fails, saying why on
# stderr, without python3 or its venv module, or when pip fails.
pinned_venv() {
    local name=$1 what=$2 venv=$3 requirements=$4 py
    py="$(command -v python3 || true)"
    [ -n "$py" ] || { echo "$name: no python3" >&2; return 1; }
    echo "$name: installing $what into $venv (pip)"
    mkdir -p "$(dirname "$venv")"
    rm -rf "$venv"
    "$py" -m venv "$venv" || { echo "$name: python3 -m venv failed (install python3-venv)" >&2; return 1; }
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
}

# reputation_keys MODE: the [reputation] keys of a benchmark mode (lines
# without the last newline): off,
# shadow and learned (contract §14's model), or confusion (learned with
# contract §15's model on every rubric).
reputation_keys() {
    case "$1" in
        confusion) printf 'mode = "learned"\nmodel = "confusion"' ;;
        *) printf 'mode = "%s"' "$1" ;;
    esac
}
