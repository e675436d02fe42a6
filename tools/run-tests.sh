#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Chromium renders the HTML report in a test (tests/test_reports.cpp [chromium]).
tools/install-deps.sh chromium
tools/build.sh
cd build
ctest --output-on-failure -j"$(nproc)"
