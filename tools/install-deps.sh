#!/usr/bin/env bash
# Installs the Debian packages memsim builds with, only those that are missing.
# Safe to run repeatedly; needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(build-essential cmake libeigen3-dev libspdlog-dev catch2 libyaml-cpp-dev
          nlohmann-json3-dev libcli11-dev
          pybind11-dev python3-dev)  # the Python module (optional in CMake; docs/python.md)
packages+=("$@")  # callers may ask for more (e.g. chromium for the report tests)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "memsim: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
