#!/usr/bin/env bash
# Property-based check of a running server against its OpenAPI description
# (src/api/openapi.json for `jurystream run`, src/connect/openapi.json for
# `jurystream connect`; docs/api.md), with schemathesis from PyPI.
#
#   scripts/schemathesis.sh install
#       install schemathesis $SCHEMATHESIS_VERSION (and its dependencies at
#       the versions of scripts/schemathesis-requirements.txt) into a
#       virtualenv under ~/.cache/jurystream-schemathesis/ if it is not
#       there (idempotent)
#   scripts/schemathesis.sh run SCHEMA_FILE_OR_URL BASE_URL [extra schemathesis args]
#       install if needed, then run every check (`--checks all`: no 5xx, every
#       status documented, every body, header and content type as documented,
#       invalid input refused with a 4xx, valid input accepted) over every
#       phase (examples, coverage, fuzzing, stateful), at most
#       $SCHEMATHESIS_MAX_EXAMPLES (default 50) cases per operation, stopped
#       after $SCHEMATHESIS_TIMEOUT seconds (default 300). Exits non-zero on
#       any failure (124 on the timeout). Extra args go to `schemathesis run`
#       as they are, e.g. -H 'Authorization: Bearer TOKEN', --seed N,
#       --exclude-path /v1/openapi.json.
#
# Examples:
#   scripts/schemathesis.sh run src/api/openapi.json http://127.0.0.1:9464
#   scripts/schemathesis.sh run http://127.0.0.1:9465/v1/openapi.json http://127.0.0.1:9465
#
# The server must be up (and, for meaningful answers, have data: docs/api.md
# says how). CLI syntax of schemathesis 4.x: `schemathesis run LOCATION
# --url BASE --checks all --max-examples N` (3.x had `--base-url` and
# `--hypothesis-max-examples`).
set -euo pipefail

SCHEMATHESIS_VERSION=4.32.5
CACHE_ROOT="${JURYSTREAM_SCHEMATHESIS_CACHE:-$HOME/.cache/jurystream-schemathesis}"
VENV="$CACHE_ROOT/schemathesis-$SCHEMATHESIS_VERSION"
BIN="$VENV/bin/schemathesis"
HERE="$(cd "$(dirname "$0")" && pwd)"
REQUIREMENTS="$HERE/schemathesis-requirements.txt"
# shellcheck source=scripts/lib.sh
. "$HERE/lib.sh"

installed() {
    [ -f "$VENV/.complete" ] && [ -x "$BIN" ] \
        && "$BIN" --version 2>/dev/null | grep -q "version $SCHEMATHESIS_VERSION\$"
}

install() {
    if installed; then
        echo "schemathesis: $SCHEMATHESIS_VERSION already installed ($VENV)"
        return 0
    fi
    pinned_venv schemathesis "schemathesis $SCHEMATHESIS_VERSION" "$VENV" "$REQUIREMENTS" || return 1
    "$BIN" --version | grep -q "version $SCHEMATHESIS_VERSION\$" \
        || { echo "schemathesis: the installed CLI is not $SCHEMATHESIS_VERSION" >&2; return 1; }
    touch "$VENV/.complete"
    echo "schemathesis: installed $BIN"
}

cmd="${1:-}"
case "$cmd" in
install)
    install
    ;;
run)
    [ $# -ge 3 ] || { echo "usage: $0 run SCHEMA_FILE_OR_URL BASE_URL [extra schemathesis args]" >&2; exit 2; }
    schema="$2"
    base="$3"
    shift 3
    install >&2
    # A file is read from where the caller stands; schemathesis then runs in
    # the report directory, where it keeps its .schemathesis/ cache of
    # failures (hypothesis' example database is off), so the work tree stays
    # clean.
    if [ -f "$schema" ]; then
        schema="$(cd "$(dirname "$schema")" && pwd)/$(basename "$schema")"
    fi
    report="${SCHEMATHESIS_REPORT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/jurystream-schemathesis.XXXXXX")}"
    mkdir -p "$report"
    report="$(cd "$report" && pwd)"
    cd "$report"
    echo "schemathesis: report and cache in $report" >&2
    # NDJSON bodies (scripts/schemathesis_hooks.py).
    export SCHEMATHESIS_HOOKS="${SCHEMATHESIS_HOOKS:-$HERE/schemathesis_hooks.py}"
    set +e
    # A run takes 10 to 40 s here; the timeout only stops one that hangs.
    timeout "${SCHEMATHESIS_TIMEOUT:-300}" "$BIN" run "$schema" \
        --url "$base" \
        --checks all \
        --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-50}" \
        --request-timeout 20 \
        --generation-database none \
        --report junit --report-dir "$report" \
        --no-color \
        "$@"
    rc=$?
    set -e
    exit $rc
    ;;
*)
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
    [ -n "$cmd" ] && exit 2 || exit 0
    ;;
esac
