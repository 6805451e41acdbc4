#!/usr/bin/env bash
# Builds libgpufailover and runs the failover demo. Arguments go to the demo:
#   --engine c|python|torch   --weights FILE.safetensors   --devices N   --short   --keep   --gms-crash
# (--engine torch needs PyTorch: bash tests/setup-frameworks.sh installs it)
set -euo pipefail
. "$(dirname "$0")/../../tests/build-env.sh"
export PYTHONPATH="$build/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$build/examples/demo/gf-failover-demo" \
  --lockd "$build/examples/gf-lockd/gf-lockd" \
  --gmsd "$build/examples/gf-gmsd/gf-gmsd" \
  --c-engine "$build/examples/c-engine/gf-c-engine" \
  --python-engine "$here/examples/python-engine/engine.py" \
  --torch-engine "$here/examples/torch-engine/engine.py" "$@"
