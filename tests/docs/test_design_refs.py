# SPDX-License-Identifier: Apache-2.0
"""The project's documents stand on their own: every citation of
docs/design.md names a decision or rule that exists there, and nothing cites
a design document that is not in the repository."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
TREES = ["docs", "lib", "include", "bindings", "examples", "tests", "README.md"]
SUFFIXES = {".md", ".c", ".h", ".py", ".pyi", ".sh", ".yaml", ".yml", ".build", ".txt", ".in", ".service"}
# "docs/design.md, decision 5", "design.md's decisions 1, 2, 4 and 6", "design.md rule 11"
CITATION = re.compile(r"design\.md\)?(?:'s)?,?\s+(decisions?|rules?)\s+((?:\d+(?:,\s*|\s+and\s+)?)+)")


def sources():
    for top in TREES:
        p = ROOT / top
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            if f.suffix in SUFFIXES or f.name == "meson.build":
                yield f, f.read_text(errors="replace")


def design_numbers():
    text = (ROOT / "docs" / "design.md").read_text()
    decisions = {int(n) for n in re.findall(r"^### Decision (\d+):", text, re.M)}
    rules = {int(n) for n in re.findall(r"^(\d+)\. \*\*", text.split("## Rules learned")[1], re.M)}
    return decisions, rules


def test_design_numbers_are_contiguous():
    decisions, rules = design_numbers()
    assert decisions == set(range(1, len(decisions) + 1))
    assert rules == set(range(1, len(rules) + 1))


def test_every_citation_resolves():
    decisions, rules = design_numbers()
    bad = []
    for f, text in sources():
        for m in CITATION.finditer(" ".join(text.split())):
            known = decisions if m.group(1).startswith("decision") else rules
            for n in re.findall(r"\d+", m.group(2)):
                if int(n) not in known:
                    bad.append(f"{f.relative_to(ROOT)}: {m.group(1)} {n}")
    assert not bad, "citations of docs/design.md that do not exist: " + ", ".join(bad)


def test_no_citation_of_documents_outside_the_repository():
    outside = re.compile(r"DESIGN\.md|LESSONS\.md|LESSONS item|DESIGN §|seed 00\d")
    bad = [f"{f.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
           for f, text in sources() if f.name != "test_design_refs.py" for m in outside.finditer(text)]
    assert not bad, "citations of documents that are not in this repository: " + ", ".join(bad)
