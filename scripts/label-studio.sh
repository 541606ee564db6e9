#!/usr/bin/env bash
# The test Label Studio: label-studio 1.23.2 (Apache-2.0, from PyPI) in a venv,
# headless, SQLite, on loopback.
#
#   scripts/label-studio.sh install             venv + pip install (~1 GB, ~2 min once)
#   scripts/label-studio.sh installed           exit 0 when it is installed
#   scripts/label-studio.sh start PORT DATA_DIR start on 127.0.0.1:PORT, data in DATA_DIR
#   scripts/label-studio.sh stop PORT           stop the server started on PORT
#   scripts/label-studio.sh env [PORT]          print LS_URL=… LS_TOKEN=… LS_USERNAME=…
#                                               LS_PASSWORD=… (eval-able; default 18080)
#
# The admin user and its legacy API token are fixed (test credentials only).
# The venv lives in ${JURYSTREAM_LS_HOME:-~/.cache/jurystream-label-studio}.
# Nothing in jurystream depends on this copy; connect talks to any Label Studio.
set -euo pipefail
LS_VERSION=1.23.2
LS_HOME="${JURYSTREAM_LS_HOME:-$HOME/.cache/jurystream-label-studio}"
VENV="$LS_HOME/venv-$LS_VERSION"
RUN_DIR="${JURYSTREAM_LS_RUN_DIR:-${TMPDIR:-/tmp}/jurystream-label-studio}"
# Test-only credentials. LABEL_STUDIO_USER_TOKEN must be 40 hex characters.
LS_USERNAME="admin@jurystream.test"
LS_PASSWORD="jurystream-test-password"
LS_TOKEN="e6a83a24897dc56f1f5446241fb4e51b63628d52"
START_TIMEOUT="${JURYSTREAM_LS_START_TIMEOUT:-180}"

# label-studio 1.23.2 asks for sentry-sdk >= 2.16 without an upper bound,
# and sentry-sdk 3 refuses an option it passes at start ("Unknown option
# 'send_default_pii'"): the install keeps it below 3, and a venv holding 3
# counts as not installed.
SENTRY_PIN="sentry-sdk>=2.16,<3"

have_ls() {
    [ -x "$VENV/bin/label-studio" ] &&
        "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("label-studio") != sys.argv[1] or int(m.version("sentry-sdk").split(".")[0]) >= 3)' "$LS_VERSION" 2>/dev/null
}

apt_install() {
    echo "label-studio: apt-get install $*"
    local SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

# Debian's python3 makes venvs only with python3-venv (ensurepip).
ensure_venv_support() {
    python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
}

# On x86_64 with CPython 3.11 every native dependency (lxml, numpy, pandas,
# psycopg-binary, pydantic-core, cryptography …) ships a manylinux wheel;
# the few sdists are pure Python, so pip needs no compiler. Should a wheel
# be missing (another architecture or Python), pip builds from source: then
# install a toolchain, Python headers and libpq, and try once more.
install_build_deps() {
    local need_apt=()
    command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
    command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
    command -v make >/dev/null 2>&1 || need_apt+=(make)
    command -v pg_config >/dev/null 2>&1 || need_apt+=(libpq-dev)
    python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
        need_apt+=(python3-dev)
    [ ${#need_apt[@]} -eq 0 ] || apt_install "${need_apt[@]}"
}

pidfile_for() { echo "$RUN_DIR/label-studio-$1.pid"; }

cmd="${1:-}"
case "$cmd" in
installed)
    have_ls
    ;;
install)
    if have_ls; then
        echo "label-studio: $LS_VERSION already installed ($VENV)"
        exit 0
    fi
    t0=$SECONDS
    ensure_venv_support
    mkdir -p "$LS_HOME"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    echo "label-studio: installing label-studio==$LS_VERSION into $VENV (~1 GB, a few minutes once)"
    pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    "${pip[@]}" --upgrade pip
    if ! "${pip[@]}" "label-studio==$LS_VERSION" "$SENTRY_PIN"; then
        echo "label-studio: pip failed; installing build tools and retrying" >&2
        install_build_deps
        "${pip[@]}" "label-studio==$LS_VERSION" "$SENTRY_PIN"
    fi
    have_ls || { echo "label-studio: install finished but label-studio $LS_VERSION is not importable" >&2; exit 1; }
    echo "label-studio: installed $LS_VERSION in $((SECONDS - t0)) s"
    ;;
start)
    [ $# -ge 3 ] || { echo "usage: scripts/label-studio.sh start PORT DATA_DIR" >&2; exit 64; }
    port="$2"
    data_dir="$3"
    mkdir -p "$RUN_DIR" "$data_dir"
    data_dir="$(cd "$data_dir" && pwd)"
    pidfile="$(pidfile_for "$port")"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "label-studio: already running on $port (pid $(cat "$pidfile"))"
        exit 0
    fi
    have_ls || { echo "label-studio: $LS_VERSION not installed: run scripts/label-studio.sh install" >&2; exit 1; }
    log="$data_dir/label-studio.log"
    t0=$SECONDS
    # setsid: its own process group, so stop ends every process it spawned.
    # SSRF_PROTECTION_ENABLED=false only because the tests register webhooks
    # on 127.0.0.1, which Label Studio otherwise refuses (403 "URL resolves
    # to a reserved network address"). A real deployment keeps SSRF
    # protection on: 1.23.2 has no allow-list, so connect needs a public
    # address, or USE_DEFAULT_BANNED_SUBNETS=false with the subnets to keep
    # banned listed in USER_ADDITIONAL_BANNED_SUBNETS minus connect's (see
    # docs/label-studio.md). LATEST_VERSION_CHECK=false: no PyPI call at start.
    env \
        LABEL_STUDIO_BASE_DATA_DIR="$data_dir" \
        LABEL_STUDIO_USERNAME="$LS_USERNAME" \
        LABEL_STUDIO_PASSWORD="$LS_PASSWORD" \
        LABEL_STUDIO_USER_TOKEN="$LS_TOKEN" \
        LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true \
        LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK=true \
        SSRF_PROTECTION_ENABLED=false \
        LATEST_VERSION_CHECK=false \
        COLLECT_ANALYTICS=false \
        setsid "$VENV/bin/label-studio" start --no-browser \
        --internal-host 127.0.0.1 --port "$port" --data-dir "$data_dir" \
        > "$log" 2>&1 < /dev/null &
    echo $! > "$pidfile"
    echo "$data_dir" > "$RUN_DIR/label-studio-$port.data-dir"
    deadline=$((SECONDS + START_TIMEOUT))
    until curl -fsS -o /dev/null "http://127.0.0.1:$port/health" 2>/dev/null; do
        if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
            echo "label-studio: exited during start; log $log:" >&2
            tail -30 "$log" >&2
            rm -f "$pidfile"
            exit 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "label-studio: /health not answering after $START_TIMEOUT s; stopping it; log $log:" >&2
            tail -30 "$log" >&2
            "$0" stop "$port" >/dev/null
            exit 1
        fi
        sleep 0.5
    done
    echo "label-studio: listening on http://127.0.0.1:$port after $((SECONDS - t0)) s (pid $(cat "$pidfile")), log $log"
    echo "label-studio: LS_URL=http://127.0.0.1:$port LS_TOKEN=$LS_TOKEN (scripts/label-studio.sh env $port)"
    ;;
stop)
    [ $# -ge 2 ] || { echo "usage: scripts/label-studio.sh stop PORT" >&2; exit 64; }
    port="$2"
    pidfile="$(pidfile_for "$port")"
    if [ -f "$pidfile" ]; then
        pid="$(cat "$pidfile")"
        # the process group setsid created (pgid = pid)
        kill -TERM -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null || true
        rm -f "$pidfile" "$RUN_DIR/label-studio-$port.data-dir"
        echo "label-studio: stopped ($port)"
    else
        echo "label-studio: not running on $port"
    fi
    ;;
env)
    port="${2:-18080}"
    echo "LS_URL=http://127.0.0.1:$port"
    echo "LS_TOKEN=$LS_TOKEN"
    echo "LS_USERNAME=$LS_USERNAME"
    echo "LS_PASSWORD=$LS_PASSWORD"
    ;;
*)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    [ -n "$cmd" ] && exit 2 || exit 0
    ;;
esac
