#!/usr/bin/env bash
# The vLLM failover test (tests/vllm/test_vllm_failover.py) on a GPU: CUDA
# vLLM from the project's venv (tests/setup-frameworks.sh), gf-gmsd and the
# GMS clients on the cuda backend, the servers started by the gf-vllm console
# script in vLLM's compiled mode (CUDA graphs captured at Init over the KV
# region): the same tokens after two failovers in a row, the KV tensors at
# their Init addresses after each wake, and the standby's Init taking no KV
# cache's worth of device memory (cuMemGetInfo, sampled through its Init;
# a 4 GiB KV cache, GF_VLLM_TEST_KV_BYTES). Skipped (exit 77), saying why,
# without a usable GPU.
set -euo pipefail
src="${GF_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
python="${GF_VENV:-$src/.venv}/bin/python"
if ! "$python" -c 'import torch, vllm, pytest; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "SKIP: no CUDA GPU usable by torch (or no torch/vllm in ${GF_VENV:-$src/.venv}: tests/setup-frameworks.sh)"
  exit 77
fi
export GF_VLLM_TEST_BACKEND=cuda
exec "$python" -m pytest -q -p no:cacheprovider "$src/tests/vllm/test_vllm_failover.py" "$@"
