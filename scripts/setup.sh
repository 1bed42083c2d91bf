#!/usr/bin/env bash
# Installs every Debian package dcp needs to build, test and run. Idempotent: installs only
# what is missing. Run as root (or with sudo available) on Debian 12.
set -euo pipefail

PACKAGES=(
  build-essential g++ cmake make pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev nlohmann-json3-dev libcli11-dev
  libopenmpi-dev openmpi-bin
  libcurl4-openssl-dev libssl-dev libxml2-dev  # the S3 backend: HTTP, SigV4 signing, XML
  python3 python3-venv python3-pip python3-dev  # python3-dev: the Python package (pip install .)
  clang libclang-rt-14-dev  # fuzz targets (scripts/fuzz.sh): -fsanitize=fuzzer runtime
  iproute2 util-linux  # mpi.hosts: network namespaces (ip netns, unshare, nsenter)
  procps  # mpi.memory_tier: pgrep, to wait until a killed job's ranks are gone
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
