#!/usr/bin/env bash
# crowd-kit (PyPI, pinned) in a virtualenv, for comparing jurystream's
# learned reviewer weights (contract §14) with crowd-kit's reviewer skills
# (tests/reputation_quality.rs, docs/testing.md "Reputation quality").
#
#   scripts/crowdkit.sh install
#       install crowd-kit $CROWDKIT_VERSION (and its dependencies at the
#       versions of scripts/crowdkit-requirements.txt) into a virtualenv
#       under ~/.cache/jurystream-crowdkit/ if it is not there (idempotent;
#       about 30 s and 300 MB, most of it dependencies crowd-kit pulls in)
#   scripts/crowdkit.sh installed
#       exit 0 when it is installed, 1 otherwise (installs nothing)
#   scripts/crowdkit.sh judge [ARGS]
#       install if needed, then run scripts/confusion/judge.py ARGS: contract
#       §15's model through a jurystream binary against crowd-kit on the same
#       votes (scripts/confusion/README.md)
#   scripts/crowdkit.sh compare VOTES.jsonl REPUTATION.json [--rubrics a,b]
#       install if needed, then run scripts/crowdkit_compare.py: Spearman
#       correlations of `jurystream reputation --format json`'s weights with
#       OneCoinDawidSkene's skills and GLAD's alphas on the same votes,
#       binarised; one JSON object on stdout
#
# JURYSTREAM_CROWDKIT_CACHE overrides the cache directory.
set -euo pipefail

CROWDKIT_VERSION=1.4.2
CACHE_ROOT="${JURYSTREAM_CROWDKIT_CACHE:-$HOME/.cache/jurystream-crowdkit}"
VENV="$CACHE_ROOT/crowd-kit-$CROWDKIT_VERSION"
PY="$VENV/bin/python"
HERE="$(cd "$(dirname "$0")" && pwd)"
REQUIREMENTS="$HERE/crowdkit-requirements.txt"
# shellcheck source=scripts/lib.sh
. "$HERE/lib.sh"

installed() {
    [ -f "$VENV/.complete" ] && [ -x "$PY" ] \
        && "$PY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("crowd-kit") != sys.argv[1])' \
            "$CROWDKIT_VERSION" 2>/dev/null
}

install() {
    if installed; then
        echo "crowdkit: crowd-kit $CROWDKIT_VERSION already installed ($VENV)"
        return 0
    fi
    pinned_venv crowdkit "crowd-kit $CROWDKIT_VERSION" "$VENV" "$REQUIREMENTS" || return 1
    "$PY" -c 'import crowdkit.aggregation' || { echo "crowdkit: crowdkit does not import" >&2; return 1; }
    touch "$VENV/.complete"
    echo "crowdkit: installed crowd-kit $CROWDKIT_VERSION ($VENV)"
}

cmd="${1:-}"
case "$cmd" in
install)
    install
    ;;
installed)
    installed
    ;;
compare)
    [ $# -ge 3 ] || { echo "usage: $0 compare VOTES.jsonl REPUTATION.json [--rubrics a,b]" >&2; exit 2; }
    shift
    install >&2
    exec "$PY" "$HERE/crowdkit_compare.py" "$@"
    ;;
judge)
    shift
    install >&2
    exec "$PY" "$HERE/confusion/judge.py" "$@"
    ;;
*)
    echo "usage: $0 install | installed | compare VOTES.jsonl REPUTATION.json [--rubrics a,b] | judge [ARGS]" >&2
    exit 2
    ;;
esac
