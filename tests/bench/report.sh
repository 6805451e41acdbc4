#!/usr/bin/env bash
# Builds libgpufailover and runs every benchmark: one table on stdout and
# build/bench-report.json. Benchmarks report ratios, never pass or fail on time.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${GF_VENV:-$here/.venv}"
export PATH="$venv/bin:$PATH"
build="${GF_BUILD:-$here/build}"
if [ -f "$build/build.ninja" ]; then
  meson setup --reconfigure "$build" >/dev/null
else
  meson setup "$build" >/dev/null
fi
meson compile -C "$build" >/dev/null
exec python3 "$here/tests/bench/report.py" --build "$build" --out "$build/bench-report.json" "$@"
