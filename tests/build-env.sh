# Sourced by the scripts that build before they run something (demo, benchmarks):
# puts the project's virtual environment first in PATH and (re)configures and
# compiles the build directory. Sets: here, build.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GF_VENV:-$here/.venv}"
export PATH="$venv/bin:$PATH"
build="${GF_BUILD:-$here/build}"
if [ -f "$build/build.ninja" ]; then
  meson setup --reconfigure "$build" >/dev/null
else
  meson setup "$build" >/dev/null
fi
meson compile -C "$build" >/dev/null
