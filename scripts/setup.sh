#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test strata: Debian packages (only the missing ones)
# and the test tooling in ./.venv. Safe to run again; does nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config git clang libclang-rt-14-dev
          libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libpcre2-dev libcpp-httplib-dev
          chromium
          python3 python3-venv python3-pip)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

stamp=.venv/.requirements
if [ ! -x .venv/bin/python ] || ! cmp -s tools/requirements.txt "$stamp"; then
    echo "setup: creating the test virtualenv .venv"
    python3 -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check -r tools/requirements.txt
    cp tools/requirements.txt "$stamp"
fi
