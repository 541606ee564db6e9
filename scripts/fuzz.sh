#!/usr/bin/env bash
# Fuzzing with cargo-fuzz / libFuzzer (not part of CI; docs/testing.md,
# "Fuzzing"). Runs the targets of fuzz/ for a time each, then prints what
# they did: executions, exec/s, coverage, corpus, crashes.
#
#   scripts/fuzz.sh [TARGETS|all] [SECONDS]
#
# TARGETS: one or more of vote_decoder, connect_intake, query_parse,
# query_router, comma-separated, or all (the default). SECONDS:
# libFuzzer's -max_total_time per target (default 3600). Environment:
#   FUZZ_PARALLEL   targets run at once (default 1; one per core)
#   FUZZ_ARGS       more libFuzzer flags (e.g. "-max_len=8192")
#   CARGO_TARGET_DIR  default ~/.cache/jurystream-fuzz-target (the fuzz
#                   build links RocksDB and librdkafka: the first build
#                   takes 15-20 min)
# Everything runs under `nice -n 19`. Installs cargo-fuzz (crates.io) and
# a nightly toolchain when missing. The corpus grows in fuzz/corpus/TARGET
# (only the seed-* files are committed), crashes land in
# fuzz/artifacts/TARGET, the logs in fuzz/logs/. Exits 1 if a target
# crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/jurystream-fuzz-target}"

ALL=(vote_decoder connect_intake query_parse query_router)
CARGO_FUZZ_VERSION=0.13.2
target="${1:-all}"
seconds="${2:-3600}"
parallel="${FUZZ_PARALLEL:-1}"

if [ "$target" = all ]; then
    targets=("${ALL[@]}")
else
    IFS=, read -r -a targets <<<"$target"
    for t in "${targets[@]}"; do
        case " ${ALL[*]} " in
            *" $t "*) ;;
            *) echo "unknown target '$t' (${ALL[*]}, comma-separated, or all)" >&2; exit 2 ;;
        esac
    done
fi
case "$seconds" in
    '' | *[!0-9]*) echo "SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;;
esac

if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz $CARGO_FUZZ_VERSION" >&2
    nice -n 19 cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

mkdir -p fuzz/logs "$CARGO_TARGET_DIR"
# query_router's stores (a temporary directory per process) go in a
# directory of this run's own, removed at the end.
run_tmp="$(mktemp -d -t jurystream-fuzz-run.XXXXXX)"
trap 'rm -rf "$run_tmp"' EXIT
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
echo "== fuzz: ${targets[*]}, ${seconds} s each, $(rustc +nightly -V), $(cargo +nightly fuzz --version)"
echo "== commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), CARGO_TARGET_DIR=$CARGO_TARGET_DIR"

# Build every target first (so that parallel runs do not race to).
build_start=$(date +%s)
for t in "${targets[@]}"; do
    nice -n 19 cargo +nightly fuzz build --target-dir "$CARGO_TARGET_DIR" "$t"
done
echo "== built in $(( $(date +%s) - build_start )) s"

run_one() {
    local t=$1 log="fuzz/logs/$1-$stamp.log"
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    local before
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    local rc=0
    # shellcheck disable=SC2086
    TMPDIR="$run_tmp" nice -n 19 cargo +nightly fuzz run --target-dir "$CARGO_TARGET_DIR" "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$seconds" -timeout=25 -print_final_stats=1 ${FUZZ_ARGS:-} \
        >"$log" 2>&1 || rc=$?
    local after
    after=$(find "fuzz/artifacts/$t" -type f | wc -l)
    echo "$rc $((after - before))" >"$log.rc"
}

for t in "${targets[@]}"; do
    echo "== run $t (log fuzz/logs/$t-$stamp.log)"
    run_one "$t" &
    while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do
        wait -n || true
    done
done
wait || true

final_stat() { sed -n "s/^stat::$2: *//p" "$1" | tail -n 1; }
failed=0
printf '\n%-15s %-7s %14s %8s %7s %8s %16s %8s\n' target result executions exec/s cov ft corpus crashes
for t in "${targets[@]}"; do
    log="fuzz/logs/$t-$stamp.log"
    read -r rc crashes <"$log.rc"
    # The last status line: "#N DONE cov: C ft: F corp: U/S ..."
    last=$(grep -E '^#[0-9]+[[:space:]]+(DONE|NEW|REDUCE|pulse|INITED)' "$log" | tail -n 1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<<"$last")
    execs=$(final_stat "$log" number_of_executed_units)
    rate=$(final_stat "$log" average_exec_per_sec)
    result=ok
    if [ "$rc" != 0 ] || [ "$crashes" != 0 ]; then
        result="FAIL($rc)"
        failed=1
    fi
    printf '%-15s %-7s %14s %8s %7s %8s %16s %8s\n' "$t" "$result" "${execs:-?}" "${rate:-?}" \
        "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes"
    if [ "$result" != ok ]; then
        grep -E 'panicked at|ERROR: |SUMMARY: |Failing input|Test unit written' "$log" | head -n 8 | sed 's/^/    /'
    fi
done
echo "(corpus: units/bytes in memory at the end; logs in fuzz/logs/*-$stamp.log)"
exit "$failed"
