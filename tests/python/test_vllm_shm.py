"""gpufailover.vllm.shm_files: a vLLM launcher lists the /dev/shm files its
tree uses and, at its start, removes the files of lists nobody holds any
more (their launcher is gone); never a file that is still in use, that was
replaced since, or that a live launcher lists. Run on a scratch directory
standing in for /dev/shm, with real processes mapping and locking."""
import json
import mmap
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import BUILD

from gpufailover.vllm import shm_files  # noqa: E402


@pytest.fixture
def shm(tmp_path):
    d = tmp_path / "shm"
    d.mkdir()
    return d


def make(d, name, size=8192):
    p = d / name
    p.write_bytes(b"x" * size)
    return p


def write_list(d, files, name="gf-vllm-1-dead.shm-list"):
    p = d / name
    p.write_text(json.dumps({"pid": 1, "files": {f.name: f.stat().st_ino for f in files}}))
    return p


def child(code):
    """A process that runs @code, says "ready" and sleeps until killed."""
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code) + "\nprint('ready', flush=True)\n"
                          "import time\nwhile True: time.sleep(60)\n"],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def stop(p):
    p.kill()
    p.wait()


def test_a_dead_launchers_files_go_and_nothing_else(shm):
    left = make(shm, "psm_dead1")
    sem = make(shm, "sem.mp-dead2")
    unlisted = make(shm, "psm_other")
    lst = write_list(shm, [left, sem])
    removed, nbytes = shm_files.sweep(str(shm))
    assert removed == 2 and nbytes >= 2 * 8192
    assert not left.exists() and not sem.exists() and not lst.exists()
    assert unlisted.exists(), "a file no list names was removed"


def test_a_listed_file_still_mapped_or_open_stays(shm):
    mapped = make(shm, "psm_mapped")
    held = make(shm, "psm_held")
    gone = make(shm, "psm_gone")
    write_list(shm, [mapped, held, gone])
    p = child(f"""
        import mmap, os
        f = open({str(mapped)!r}, "r+b"); m = mmap.mmap(f.fileno(), 0); f.close()
        fd = os.open({str(held)!r}, os.O_RDONLY)
    """)
    try:
        assert shm_files.sweep(str(shm))[0] == 1
        assert mapped.exists() and held.exists() and not gone.exists()
    finally:
        stop(p)


def test_a_live_launchers_list_is_left_alone(shm):
    """The lock on a list is its launcher's life: held, nothing of it goes;
    dropped by a SIGKILL, the next sweep removes it."""
    f = make(shm, "psm_live")
    p = child(f"""
        import sys; sys.path.insert(0, {str(BUILD / "bindings" / "python")!r})
        from gpufailover.vllm import shm_files
        import mmap
        lst = shm_files.FileList({str(shm)!r})
        fd = open({str(f)!r}, "r+b"); m = mmap.mmap(fd.fileno(), 0); fd.close()
        import os; assert lst.record(os.getpgid(0)) == 1
    """)
    try:
        lists = list(shm.glob("gf-vllm-*.shm-list"))
        assert len(lists) == 1 and lists[0].name.startswith(f"gf-vllm-{p.pid}-")
        assert json.loads(lists[0].read_text())["files"] == {"psm_live": f.stat().st_ino}
        assert shm_files.sweep(str(shm)) == (0, 0)
        assert f.exists() and lists[0].exists()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert shm_files.sweep(str(shm))[0] == 1
    assert not f.exists() and not lists[0].exists()


def test_a_file_made_again_under_a_listed_name_stays(shm):
    old = make(shm, "psm_reused")
    lst = write_list(shm, [old])
    moved = old.rename(shm / "psm_moved")  # the old inode lives on, so the new file cannot get its number
    new = make(shm, "psm_reused")
    assert new.stat().st_ino != moved.stat().st_ino
    assert shm_files.sweep(str(shm)) == (0, 0)
    assert new.exists() and moved.exists() and not lst.exists()


@pytest.mark.parametrize("text", [b"", b"{", b"[1, 2]", b'{"files": [1]}', b'{"files": {"../x": 1, "a/b": 2}}',
                                  b'{"files": {"psm_x": "1"}}', b"\xff\xfe"])
def test_a_broken_list_removes_nothing_and_goes(shm, tmp_path, text):
    f = make(shm, "psm_x")
    outside = make(tmp_path, "x")
    lst = shm / "gf-vllm-9-broken.shm-list"
    lst.write_bytes(text)
    assert shm_files.sweep(str(shm)) == (0, 0)
    assert f.exists() and outside.exists() and not lst.exists()


def test_record_lists_what_the_group_uses(shm):
    a, b, other = make(shm, "psm_a"), make(shm, "sem.mp-b"), make(shm, "psm_other")
    p = child(f"""
        import mmap, os, subprocess, sys
        f = open({str(a)!r}, "r+b"); m = mmap.mmap(f.fileno(), 0); f.close()
        # a second process of the same group, holding the other file open
        kid = subprocess.Popen([sys.executable, "-c", "import os, time; fd = os.open({str(b)!r}, os.O_RDONLY); "
                                "print('k', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
        assert kid.stdout.readline().strip() == "k"
    """)
    q = child(f"""
        import mmap
        f = open({str(other)!r}, "r+b"); m = mmap.mmap(f.fileno(), 0); f.close()
    """)
    try:
        lst = shm_files.FileList(str(shm))
        try:
            assert lst.record(p.pid) == 2
            assert lst.files == {"psm_a": a.stat().st_ino, "sem.mp-b": b.stat().st_ino}
            assert json.loads(pathlib.Path(lst.path).read_text())["files"] == lst.files
            assert lst.record(p.pid) == 2  # again: the same list, not longer
        finally:
            os.close(lst.fd)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        stop(q)


def test_a_mapping_in_this_process_counts_too(shm):
    f = make(shm, "psm_here")
    write_list(shm, [f])
    with open(f, "r+b") as fh:
        m = mmap.mmap(fh.fileno(), 0)
    try:
        assert shm_files.sweep(str(shm)) == (0, 0) and f.exists()
    finally:
        m.close()


def test_sweep_when_gone_waits_for_a_killed_group(shm):
    """After a killpg the files go once the group's processes are gone; an
    unreaped zombie of the group (it maps nothing) is not waited for."""
    f = make(shm, "psm_killed")
    write_list(shm, [f])
    p = child(f"""
        import mmap
        fh = open({str(f)!r}, "r+b"); m = mmap.mmap(fh.fileno(), 0); fh.close()
    """)
    assert shm_files.group_members(p.pid) == [p.pid]
    os.killpg(p.pid, signal.SIGKILL)  # not reaped until the end: a zombie meanwhile
    try:
        assert shm_files.sweep_when_gone([p.pid], timeout=20, shm_dir=str(shm))[0] == 1
        assert not f.exists()
        assert shm_files.group_members(p.pid) == []
    finally:
        p.wait()
