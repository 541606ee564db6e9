#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs (Debian
# packages, the tansu test broker, Label Studio for the `connect` test,
# schemathesis), builds, runs the unit, golden, property and real-broker
# integration tests (the OpenAPI documents checked by schemathesis among them)
# and the conformance cases of tests/conformance (tests/conformance.rs), then
# the shared conformance kit when it is beside the repository
# (../shared/conformance; optional).
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
# test-hooks: the fault-injection seams some broker tests use (Cargo.toml);
# the binary the tests run is built by cargo test itself.
cargo test --locked --features test-hooks --no-fail-fast

# The release binary, the one the README, the quickstart and the demos
# run: it must stay under 100 MB (the C libraries are built without debug
# info, Cargo.toml's profile.release.package sections).
cargo build --release --locked --bins
RELEASE="${CARGO_TARGET_DIR:-target}/release/jurystream"
SIZE=$(stat -c %s "$RELEASE")
echo "release binary: $SIZE bytes"
if [ "$SIZE" -ge 100000000 ]; then
    echo "the release binary is $SIZE bytes, over 100 MB: did a C library's" \
        "profile.release.package section (debug = false) go?" >&2
    exit 1
fi
# The first hour, with that same binary: the quickstart (the main job on
# the example, on the test broker) and the Label Studio demo (webhooks,
# scores with learned reviewer weights, a disputed task sent back).
JURYSTREAM_BIN="$RELEASE" scripts/quickstart.sh
JURYSTREAM_BIN="$RELEASE" scripts/label-studio-demo.sh

# The project's own conformance cases (tests/conformance) ran in cargo test
# above. The shared kit may hold newer cases: run it when it is there.
BIN="${CARGO_TARGET_DIR:-target}/debug/jurystream"
if [ -x ../shared/conformance/check.sh ]; then
    ../shared/conformance/check.sh "$BIN"
    # contract §13 (effective_votes, score_interval)
    CHECK_CASES="$(cd ../shared/conformance && pwd)/cases-v3" ../shared/conformance/check.sh "$BIN"
    # contract §14 (learned reviewer reputation)
    CHECK_CASES="$(cd ../shared/conformance && pwd)/cases-v4" ../shared/conformance/check.sh "$BIN"
else
    echo "note: no shared conformance kit at ../shared/conformance/check.sh (optional);" \
        "the project's own cases (tests/conformance) ran in cargo test"
fi
