#!/usr/bin/env bash
# For building on a machine without Debian's registry (the GPU machine): downloads, here, the Debian packages of
# Strata's build and test dependencies beyond ../shared/peer/prepare.sh's list into DIR (default .peer/debs), to be
# unpacked there under /tmp/deps like the rest (`source .peer/device.sh env` unpacks every .deb in that folder).
# Keep in step with scripts/setup.sh.
set -euo pipefail
dir=${1:-.peer/debs}
mkdir -p "$dir" && cd "$dir"
apt-get download libmicrohttpd-dev libmicrohttpd12 libvalijson-dev 2>&1 | grep -v '^W:' | tail -1
