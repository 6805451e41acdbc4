# SPDX-License-Identifier: Apache-2.0
"""The extension's link: its own helpers carry the gfpy_ prefix, so none of
them stands in for a library function of the same name (jansson's json_loads
was once shadowed inside the extension), and it exports nothing but its init
function and the two entry points of PyTorch's pluggable allocator."""
import shutil
import subprocess

import pytest

import gpufailover as gf

NM = shutil.which("nm")


def symbols(*flags):
    out = subprocess.run([NM, *flags, gf._gpufailover.__file__], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            rows.append((parts[-2], parts[-1].split("@")[0]))
    return rows


@pytest.mark.skipif(NM is None, reason="nm (binutils) not installed")
def test_exports_only_init_and_torch_entry_points():
    exported = {name for kind, name in symbols("-D", "--defined-only")}
    assert exported == {"PyInit__gpufailover", "gf_torch_malloc", "gf_torch_free"}


@pytest.mark.skipif(NM is None, reason="nm (binutils) not installed")
def test_no_jansson_function_is_defined_inside_the_extension():
    # json_* belong to libjansson, which the extension links dynamically;
    # a definition inside the extension would capture the library's calls.
    defined = {name for kind, name in symbols() if kind not in ("U", "w", "v") and name.startswith("json_")}
    assert not defined, f"defined inside the extension: {sorted(defined)}"
