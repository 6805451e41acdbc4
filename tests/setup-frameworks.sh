#!/usr/bin/env bash
# Installs the frameworks the framework tests run against, into the virtual
# environment tests/setup.sh made: PyPI's torch (its CPU path is enough; the
# wheel also carries CUDA libraries, so it is large) and vLLM, whose
# sleep-mode backend seam gpufailover.vllm plugs into. Versions are pinned:
# vllm 0.32.0 is the newest that installs from the registry here (0.33.0
# needs a newer certifi), and torch is the version it requires. About 8.4 GB
# and several minutes the first time; a no-op once installed. Only the test
# command (tests/run-all.sh) and the demo's `--engine torch` need this.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${GF_VENV:-$here/.venv}"
torch_version=2.13.0
vllm_version=0.32.0
if [ ! -x "$venv/bin/python" ]; then
  echo "setup-frameworks: no virtual environment at $venv: run tests/setup.sh first" >&2
  exit 1
fi
if "$venv/bin/python" - "$torch_version" "$vllm_version" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if (version("torch").split("+")[0], version("vllm")) == tuple(sys.argv[1:]) else 1)
PY
then
  exit 0
fi
echo "setup-frameworks: installing torch $torch_version and vllm $vllm_version (large; takes minutes)" >&2
# Measured: 9.5 GB at the peak (the installed files and the downloads), 8.4 GB after.
. "$here/tests/disk-check.sh"
disk_check setup-frameworks "$venv" 10 "installing torch and vllm"
# No wheel cache: it would keep gigabytes of downloads the disk may not have
# (tests/setup-vllm-cpu.sh hard-links what it shares with this environment).
# torch first, then vLLM: pip holds every download of one install until it
# ends, so two installs peak lower than one (each about 3.5 GB of downloads).
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir)
"${pip[@]}" "torch==$torch_version"
"${pip[@]}" "torch==$torch_version" "vllm==$vllm_version"
echo "setup-frameworks: ok" >&2
