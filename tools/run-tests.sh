#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Chromium renders the HTML report in a test (tests/test_reports.cpp [chromium]) and loads
# the web page (ctest web_page), which emscripten builds (web/build.sh, docs/web.md).
tools/install-deps.sh chromium emscripten
tools/build.sh
web/build.sh
cd build
ctest --output-on-failure -j"$(nproc)"
