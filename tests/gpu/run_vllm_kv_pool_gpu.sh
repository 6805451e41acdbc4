#!/usr/bin/env bash
# The vLLM KV pool test (tests/vllm/test_vllm_kv_pool.py) on a GPU: CUDA vLLM
# from the project's venv (tests/setup-frameworks.sh), gf-gmsd (fenced by the
# lock) and the GMS clients on the cuda backend: after a SIGKILL failover the
# standby's wake creates no device memory of the cache's size (cuMemGetInfo),
# the same prompts give the same tokens, and a prompt sharing a long prefix
# with one served before the kill hits vLLM's prefix cache and answers
# sooner than a cold one. Skipped (exit 77), saying why, without a usable GPU:
# never a pass without one.
set -euo pipefail
src="${GF_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
python="${GF_VENV:-$src/.venv}/bin/python"
if ! "$python" -c 'import torch, vllm, pytest; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "SKIP: no CUDA GPU usable by torch (or no torch/vllm in ${GF_VENV:-$src/.venv}: tests/setup-frameworks.sh)"
  exit 77
fi
export GF_VLLM_TEST_BACKEND=cuda
exec "$python" -m pytest -q -p no:cacheprovider "$src/tests/vllm/test_vllm_kv_pool.py" "$@"
