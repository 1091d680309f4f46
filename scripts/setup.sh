#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks, and nothing it has: the build's Debian packages, and with --tests the
# test tooling too (GoogleTest, valijson for the grammar property test, clang for the fuzzer, Chromium for the
# chat-page test, and ./.venv with the Python cross-checks). Safe to run again; does nothing when everything is present.
#   scripts/setup.sh            what building and running strata need (scripts/quickstart.sh)
#   scripts/setup.sh --tests    and what the tests need (scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

tests=0
case "${1:-}" in
    "") ;;
    --tests) tests=1 ;;
    *) echo "usage: scripts/setup.sh [--tests]" >&2; exit 2 ;;
esac

packages=(build-essential cmake pkg-config git libcli11-dev nlohmann-json3-dev libpcre2-dev libmicrohttpd-dev)
if [ "$tests" = 1 ]; then
    packages+=(libgtest-dev libgmock-dev libbenchmark-dev libvalijson-dev clang libclang-rt-14-dev chromium
               python3 python3-venv python3-pip)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    step "setup: apt-get update" $sudo apt-get update -qq
    step "setup: installing ${#missing[@]} Debian packages (${missing[*]})" \
        env DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$tests" = 1 ]; then
    stamp=.venv/.requirements
    if [ ! -x .venv/bin/python ] || ! cmp -s tools/requirements.txt "$stamp"; then
        step "setup: creating the test virtualenv .venv" python3 -m venv .venv
        step "setup: installing the Python test tooling into .venv (tools/requirements.txt)" \
            .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off -r tools/requirements.txt
        cp tools/requirements.txt "$stamp"
    fi
fi
