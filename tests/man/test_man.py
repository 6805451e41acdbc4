# SPDX-License-Identifier: Apache-2.0
"""The man pages (docs/man) render without warnings and name every option
their program's --help lists; the bash completion of gfctl is valid bash
and completes the real groups, commands and options; meson installs both."""
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest

SOURCE = pathlib.Path(os.environ.get("GF_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
BUILD = pathlib.Path(os.environ.get("GF_BUILD_ROOT", SOURCE / "build"))
MAN = SOURCE / "docs" / "man"
COMPLETION = SOURCE / "examples" / "completion" / "gfctl.bash"
GFCTL = BUILD / "examples" / "gfctl" / "gfctl"
PROGRAMS = {"gfctl.1": GFCTL, "gf-lockd.8": BUILD / "examples" / "gf-lockd" / "gf-lockd",
            "gf-gmsd.8": BUILD / "examples" / "gf-gmsd" / "gf-gmsd",
            "gf-supervise.8": BUILD / "examples" / "gf-supervise" / "gf-supervise"}


def render(page):
    """The page as text, and groff's warnings (-ww: all of them)."""
    groff = shutil.which("groff")
    if not groff:
        pytest.skip("no groff (Debian: groff-base)")
    r = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-P-c", str(MAN / page)],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, LC_ALL="C.UTF-8"))
    assert r.returncode == 0, r.stderr
    return re.sub(r".\x08", "", r.stdout), r.stderr


def gfctl_commands():
    out = subprocess.run([GFCTL, "--help"], capture_output=True, text=True, timeout=30).stdout
    return re.findall(r"^  ([a-z]+) ([a-z-]+) ", out, re.M)


@pytest.mark.parametrize("page", sorted(PROGRAMS))
def test_page_renders_without_warnings(page):
    text, warnings = render(page)
    assert warnings == "", warnings
    name = page.rsplit(".", 1)[0]
    assert "NAME" in text and "SYNOPSIS" in text and name in text
    if shutil.which("man"):
        r = subprocess.run(["man", "--warnings", "-l", str(MAN / page)], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, MANPAGER="cat", MANWIDTH="80", LC_ALL="C.UTF-8"))
        assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("page", sorted(p for p in PROGRAMS if p != "gfctl.1"))
def test_daemon_page_names_every_option(page):
    help_text = subprocess.run([PROGRAMS[page], "--help"], capture_output=True, text=True, timeout=30)
    options = set(re.findall(r"^\s+(--[a-z][a-z-]*)", help_text.stdout + help_text.stderr, re.M)) - {"--help"}
    assert options, help_text
    text, _ = render(page)
    text = text.replace("\u2010", "-").replace("\u2212", "-")
    missing = sorted(o for o in options if o not in text)
    assert not missing, f"{page} lacks {missing}"


def test_gfctl_page_names_every_command():
    text, _ = render("gfctl.1")
    text = re.sub(r"\s+", " ", text.replace("\u2010", "-").replace("\u2212", "-"))
    missing = [f"{g} {c}" for g, c in gfctl_commands() if f"{g} {c}" not in text]
    assert not missing, missing


def bash(script):
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def complete(words):
    """COMPREPLY for the command line `words` (the last word being completed)."""
    cw = " ".join(f"'{w}'" for w in words)
    r = bash(f". '{COMPLETION}'; COMP_WORDS=({cw}); COMP_CWORD={len(words) - 1}; _gfctl; "
             f"printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_completion_is_valid_bash_and_registers():
    assert bash(f"bash -n '{COMPLETION}'").returncode == 0
    r = bash(f". '{COMPLETION}'; complete -p gfctl")
    assert r.returncode == 0 and "_gfctl" in r.stdout, r.stdout + r.stderr


def test_completion_lists_the_real_commands():
    commands = gfctl_commands()
    groups = {g for g, _ in commands}
    assert groups <= complete([str(GFCTL), ""])
    for g in groups:
        assert complete([str(GFCTL), g, ""]) - {"--help"} == {c for gg, c in commands if gg == g}, g


def test_completion_reads_each_commands_options():
    got = complete([str(GFCTL), "lock", "acquire", "--"])
    assert {"--lock", "--id", "--timeout", "--gpu", "--model"} <= got, got
    assert "--to" in complete([str(GFCTL), "gms", "demote", "--"])
    assert complete([str(GFCTL), "gms", "demote", "--to", ""]) == {"warm", "cold"}


def test_meson_installs_pages_and_completion():
    installed = json.loads((BUILD / "meson-info" / "intro-installed.json").read_text())
    dests = {pathlib.PurePath(d).as_posix() for d in installed.values()}
    for page in PROGRAMS:
        section = page.rsplit(".", 1)[1]
        assert any(d.endswith(f"/man/man{section}/{page}") for d in dests), page
    assert any(d.endswith("/bash-completion/completions/gfctl") for d in dests)
