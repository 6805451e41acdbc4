# SPDX-License-Identifier: Apache-2.0
"""docs/api.md must be what tests/docs/gen_api.py makes of the headers now."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_api_reference_is_current():
    want = subprocess.run([sys.executable, str(ROOT / "tests" / "docs" / "gen_api.py")], check=True,
                          capture_output=True, text=True).stdout
    have = (ROOT / "docs" / "api.md").read_text()
    assert have == want, "docs/api.md is stale: run python3 tests/docs/gen_api.py > docs/api.md"


def test_every_exported_function_is_documented():
    import re
    missing = []
    for h in [ROOT / "include" / "gpufailover.h"] + sorted((ROOT / "include" / "gpufailover").glob("*.h")):
        src = h.read_text()
        for m in re.finditer(r"^GF_EXPORT[^;{]*?(\w+)\s*\(", src, re.M):
            before = src[:m.start()].rstrip()
            if not before.endswith("*/"):
                missing.append(f"{h.name}: {m.group(1)}")
    assert not missing, "public functions without a comment: " + ", ".join(missing)
