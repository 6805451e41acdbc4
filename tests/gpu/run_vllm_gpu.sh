#!/usr/bin/env bash
# Runs one of tests/vllm's pair tests (its file name the first argument) on a
# GPU: CUDA vLLM from the project's venv (tests/setup-frameworks.sh), gf-gmsd
# and the GMS clients on the cuda backend, the servers started by the gf-vllm
# console script in vLLM's compiled mode (CUDA graphs captured at Init over
# the KV region). What each test checks there:
# - test_vllm_failover.py: the same tokens after two failovers in a row, the
#   KV tensors at their Init addresses after each wake, and the standby's
#   Init taking no KV cache's worth of device memory (cuMemGetInfo, sampled
#   through its Init; a 4 GiB KV cache, GF_VLLM_TEST_KV_BYTES);
# - test_vllm_kv_pool.py: gf-gmsd fenced by the lock; after a SIGKILL
#   failover the standby's wake creates no device memory of the cache's size,
#   the same prompts give the same tokens, and a prompt sharing a long prefix
#   with one served before the kill hits vLLM's prefix cache and answers
#   sooner than a cold one.
# Skipped (exit 77), saying why, without a usable GPU: never a pass without one.
set -euo pipefail
if [ $# -lt 1 ] || [[ "$1" != test_vllm_*.py ]]; then
  echo "usage: $0 test_vllm_NAME.py [pytest args]" >&2
  exit 2
fi
test_file=$1
shift
src="${GF_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
if [ ! -f "$src/tests/vllm/$test_file" ]; then
  echo "no such test: $src/tests/vllm/$test_file" >&2
  exit 2
fi
python="${GF_VENV:-$src/.venv}/bin/python"
if ! "$python" -c 'import torch, vllm, pytest; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "SKIP: no CUDA GPU usable by torch (or no torch/vllm in ${GF_VENV:-$src/.venv}: tests/setup-frameworks.sh)"
  exit 77
fi
export GF_VLLM_TEST_BACKEND=cuda
exec "$python" -m pytest -q -p no:cacheprovider "$src/tests/vllm/$test_file" "$@"
