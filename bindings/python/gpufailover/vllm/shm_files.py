# SPDX-License-Identifier: Apache-2.0
"""The /dev/shm files of a vLLM process tree, and their removal once the tree
is gone.

vLLM makes named shared memory: Python's ``shared_memory`` segments
(``psm_*``), multiprocessing's semaphores (``sem.mp-*``) and its CPU
backend's ``vllm_*-cpushm`` files. Its resource tracker removes them when
the tree ends normally, but it dies with the tree when the tree is killed
(``SIGKILL``, the loss policy's ``killpg``, a crash), and the files stay. In
a pod whose ``/dev/shm`` outlives container restarts they pile up with every
failover.

So each launcher keeps a list of the files its tree maps or holds open
(``gf-vllm-<pid>-<random>.shm-list`` in the same directory) and holds an
``flock`` on that list for its whole life: the kernel drops the lock when
the launcher dies, in any PID namespace. A launcher that starts removes the
files of every list nobody holds, but only a file that:

- still has the inode the list recorded (not a new file of the same name),
- belongs to the list's owner, and
- no process this one can see maps or holds open.

A file of a live engine is never on an unlocked list, and a list's file
that another live process uses is kept.
"""
import errno
import fcntl
import json
import os
import secrets
import stat
import time
from typing import Iterator, Optional

SHM_DIR = "/dev/shm"
LIST_PREFIX = "gf-vllm-"
LIST_SUFFIX = ".shm-list"


def _pids() -> "Iterator[int]":
    for d in os.listdir("/proc"):
        if d.isdigit():
            yield int(d)


def _live_pgid(pid: int) -> Optional[int]:
    """@pid's process group; None when it is gone or a zombie (which maps
    and holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
    fields = text[text.rfind(b")") + 2:].split()
    if len(fields) < 3 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[2])


def group_members(pgid: int) -> "list[int]":
    """The live processes of group @pgid this one can see."""
    return [pid for pid in _pids() if _live_pgid(pid) == pgid]


def sweep_when_gone(pgids: "list[int]", timeout: float = 30.0, shm_dir: str = SHM_DIR) -> "tuple[int, int]":
    """For whoever killed vLLM trees (the groups @pgids): wait up to
    @timeout s for their processes to end, then sweep() as their next
    launcher would. A file a process still uses stays either way."""
    end = time.monotonic() + timeout
    while any(group_members(g) for g in pgids) and time.monotonic() < end:
        time.sleep(0.05)
    return sweep(shm_dir)


def _used_by(pid: int, shm_dir: str, dev: int) -> "set[int]":
    """Inode numbers of files in @shm_dir (device @dev) that @pid maps or
    holds open; empty when the process is gone or not ours to read."""
    inodes: "set[int]" = set()
    prefix = shm_dir.rstrip("/") + "/"
    try:
        with open(f"/proc/{pid}/maps", errors="replace") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(prefix):
                    inodes.add(int(fields[4]))
    except OSError:
        pass
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if st.st_dev == dev:
            inodes.add(st.st_ino)
    return inodes


def files_of_group(pgid: int, shm_dir: str = SHM_DIR) -> "dict[str, int]":
    """The files in @shm_dir (name -> inode) that a process of group @pgid
    maps or holds open, lists excepted."""
    dev = os.stat(shm_dir).st_dev
    inodes: "set[int]" = set()
    for pid in group_members(pgid):
        inodes |= _used_by(pid, shm_dir, dev)
    found = {}
    for entry in os.scandir(shm_dir):
        if entry.name.startswith(LIST_PREFIX) and entry.name.endswith(LIST_SUFFIX):
            continue
        try:
            if entry.is_file(follow_symlinks=False) and entry.inode() in inodes:
                found[entry.name] = entry.inode()
        except OSError:
            continue
    return found


def in_use(shm_dir: str = SHM_DIR) -> "set[int]":
    """Inode numbers of files in @shm_dir that any process this one can see
    maps or holds open."""
    dev = os.stat(shm_dir).st_dev
    inodes: "set[int]" = set()
    for pid in _pids():
        inodes |= _used_by(pid, shm_dir, dev)
    return inodes


def sweep(shm_dir: str = SHM_DIR) -> "tuple[int, int]":
    """Remove the files of every list whose launcher is gone (see the module's
    text), and those lists. Returns (files removed, their bytes)."""
    removed = nbytes = 0
    busy: "Optional[set[int]]" = None
    for entry in os.scandir(shm_dir):
        if not (entry.name.startswith(LIST_PREFIX) and entry.name.endswith(LIST_SUFFIX)):
            continue
        try:
            fd = os.open(entry.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue  # its launcher lives
                raise
            owner = os.fstat(fd).st_uid
            try:
                with os.fdopen(os.dup(fd), "rb") as f:
                    listed = json.loads(f.read(1 << 20) or b"{}").get("files", {})
                if not isinstance(listed, dict):
                    listed = {}
            except (ValueError, AttributeError):
                listed = {}  # a list cut short by its launcher's death: nothing to attribute
            if busy is None and listed:
                busy = in_use(shm_dir)
            for name, ino in listed.items():
                if not isinstance(name, str) or not isinstance(ino, int) or "/" in name or name in (".", ".."):
                    continue
                path = os.path.join(shm_dir, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if st.st_ino != ino or st.st_uid != owner or not stat.S_ISREG(st.st_mode):
                    continue
                if busy is not None and st.st_ino in busy:
                    continue
                try:
                    os.unlink(path)
                except OSError:
                    continue
                removed += 1
                nbytes += st.st_blocks * 512
            try:
                os.unlink(entry.path)
            except OSError:
                pass
        finally:
            os.close(fd)
    return removed, nbytes


class FileList:
    """This launcher's list: made and locked at once, rewritten in place by
    record() (the lock belongs to this open file, so the file is never
    replaced)."""

    def __init__(self, shm_dir: str = SHM_DIR) -> None:
        self.shm_dir = shm_dir
        self.path = os.path.join(shm_dir, f"{LIST_PREFIX}{os.getpid()}-{secrets.token_hex(4)}{LIST_SUFFIX}")
        self.files: "dict[str, int]" = {}
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def record(self, pgid: int) -> int:
        """Add the files group @pgid uses now; returns how many are listed."""
        self.files.update(files_of_group(pgid, self.shm_dir))
        data = json.dumps({"pid": os.getpid(), "files": self.files}).encode()
        # The list only grows, so the new text overwrites the old one whole
        # and the truncation cuts nothing that was valid. A death during the
        # write leaves the old list or the new one (a list longer than a
        # page could be left unreadable: its files then stay).
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))
        return len(self.files)
