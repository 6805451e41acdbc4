#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Generates docs/api.md from the public headers' Doxygen comments, so the
API reference cannot drift from the code:

    python3 tests/docs/gen_api.py > docs/api.md

test_api_doc.py fails when the checked-in file differs from this output."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADERS = [ROOT / "include" / "gpufailover.h"] + sorted((ROOT / "include" / "gpufailover").glob("*.h"))


def clean(comment):
    body = re.sub(r"^/\*\*?<?|\*/$", "", comment.strip())
    lines = [re.sub(r"^\s*\* ?", "", l) for l in body.splitlines()]
    text = "\n".join(lines).strip()
    text = re.sub(r"@p (\w+)", r"`\1`", text)
    text = re.sub(r"@(brief|file \S+|defgroup \S+)\s*", "", text)
    text = re.sub(r"^\s*@[{}]\s*$", "", text, flags=re.M)
    return text.strip()


def declarations(src):
    """(comment, declaration) for every GF_EXPORT function, in order."""
    out = []
    pattern = re.compile(r"(/\*\*(?:(?!\*/).)*\*/)\s*^(GF_EXPORT[^;{]*;)|^(GF_EXPORT[^;{]*;)", re.S | re.M)
    for m in pattern.finditer(src):
        comment, decl = (m.group(1), m.group(2)) if m.group(2) else ("", m.group(3))
        decl = " ".join(decl.replace("GF_EXPORT ", "").split())
        out.append((clean(comment) if comment else "", decl))
    return out


def file_doc(src):
    m = re.search(r"/\*\*\s*\n\s*\* @file.*?\*/", src, re.S)
    return clean(m.group(0)) if m else ""


def main():
    out = ["# API reference", "",
           "Generated from the public headers by `tests/docs/gen_api.py`; the test suite checks that it is",
           "current. Conventions for every call are at the top of `gpufailover/base.h`: 0 or a negative",
           "`GF_ERR_*` code, out-parameters written only on success, `*_free(NULL)` is a no-op, and",
           "`gf_error_detail()` explains the last failure of the calling thread.", ""]
    for h in HEADERS:
        src = h.read_text()
        rel = h.relative_to(ROOT / "include")
        out += [f"## `{rel}`", ""]
        doc = file_doc(src)
        if doc:
            out += [doc, ""]
        for comment, decl in declarations(src):
            out += ["```c excerpt", decl, "```", ""]
            if comment:
                out += [comment, ""]
    sys.stdout.write("\n".join(out).rstrip() + "\n")


if __name__ == "__main__":
    main()
