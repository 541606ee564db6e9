#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs (Debian
# packages, the tansu test broker, Label Studio for the `connect` test,
# schemathesis), builds, runs the unit, golden, property and real-broker
# integration tests (the OpenAPI documents checked by schemathesis among them),
# then the shared conformance kit.
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

scripts/install-deps.sh
scripts/broker.sh install
# Label Studio 1.23.2 in a venv (~80 s once): tests/label_studio.rs.
scripts/label-studio.sh install
# schemathesis (pinned, in a venv): the OpenAPI checks of tests/query_api.rs
# and tests/connect.rs.
scripts/schemathesis.sh install
# The broker tests use $TANSU (tests/kafka_support/mod.rs, fn tansu): the
# binary scripts/broker.sh would start, unless the caller names one.
if [ -n "${TANSU:-}" ]; then
    echo "test broker: \$TANSU=$TANSU (set by the caller): $("$TANSU" --version)"
else
    TANSU="$(scripts/broker.sh path)"
    echo "test broker: $(scripts/broker.sh which)"
fi
export TANSU

# Broker tests fail (instead of skipping) when the broker is missing.
export JURYSTREAM_REQUIRE_BROKER=1
cargo build --locked --bins
cargo test --locked --no-fail-fast

BIN="${CARGO_TARGET_DIR:-target}/debug/jurystream"
if [ -x ../shared/conformance/check.sh ]; then
    ../shared/conformance/check.sh "$BIN"
    # SPEC §13 (effective_votes, score_interval)
    CHECK_CASES="$(cd ../shared/conformance && pwd)/cases-v3" ../shared/conformance/check.sh "$BIN"
    CHECK_CASES="$(cd ../shared/conformance && pwd)/cases-v4" ../shared/conformance/check.sh "$BIN"
else
    echo "conformance kit not found at ../shared/conformance/check.sh" >&2
    exit 1
fi
