#!/usr/bin/env bash
# Builds libgpufailover and runs every benchmark: one table on stdout and
# build/bench-report.json. Benchmarks report ratios, never pass or fail on time.
set -euo pipefail
. "$(dirname "$0")/../../tests/build-env.sh"
exec python3 "$here/tests/bench/report.py" --build "$build" --out "$build/bench-report.json" "$@"
