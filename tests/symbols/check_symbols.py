#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The version script lists the exported symbols explicitly, and three lists
agree: every GF_EXPORT function declared under include/, every name in
lib/libgpufailover.sym, and what `nm -D` finds defined in the built shared
library. A mismatch prints each missing name and where it is missing, so a
new public function is added to the .sym file in the same change.

    check_symbols.py SOURCE_ROOT LIBGPUFAILOVER_SO
"""
import pathlib
import re
import subprocess
import sys


def header_functions(root):
    names = set()
    for path in sorted((root / "include").rglob("*.h")):
        text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
        names.update(re.findall(r"^GF_EXPORT\b[^;{]*?\b(gf_\w+)\s*\(", text, flags=re.M))
    return names


def version_script(path):
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    names, problems = set(), []
    for node, body in re.findall(r"([\w.]+)\s*\{(.*?)\}\s*[\w.]*\s*;", text, flags=re.S):
        m = re.search(r"global:(.*?)(local:|$)", body, flags=re.S)
        for entry in (e.strip() for e in (m.group(1) if m else "").split(";")):
            if not entry:
                continue
            if any(c in entry for c in "*?["):
                problems.append(f"{node}: the pattern '{entry}' exports whatever matches: list names instead")
            else:
                names.add(entry)
    return names, problems


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtWwDdBbRrVvi" and not parts[2].startswith("LIBGPUFAILOVER"):
            names.add(parts[2].split("@")[0])
    return names


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1])
    hdr = header_functions(root)
    sym, problems = version_script(root / "lib" / "libgpufailover.sym")
    nm = exported(sys.argv[2])
    checks = [
        (hdr - sym, "declared GF_EXPORT in include/ but missing from lib/libgpufailover.sym"),
        (sym - hdr, "listed in lib/libgpufailover.sym but declared nowhere in include/"),
        (hdr - nm, "declared GF_EXPORT in include/ but not exported by the built library (defined?)"),
        (nm - hdr, "exported by the built library but not declared GF_EXPORT in include/"),
    ]
    for names, why in checks:
        problems += [f"{n}: {why}" for n in sorted(names)]
    for p in problems:
        print(f"not ok: {p}")
    print(f"{len(hdr)} public functions, {len(sym)} in the version script, {len(nm)} exported")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
