#!/usr/bin/env bash
# Builds libgpufailover and runs the failover demo. Arguments go to the demo:
#   --engine c|python   --weights FILE.safetensors   --devices N   --short   --keep
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
export PYTHONPATH="$build/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$build/examples/demo/gf-failover-demo" \
  --lockd "$build/examples/gf-lockd/gf-lockd" \
  --gmsd "$build/examples/gf-gmsd/gf-gmsd" \
  --c-engine "$build/examples/c-engine/gf-c-engine" \
  --python-engine "$here/examples/python-engine/engine.py" "$@"
