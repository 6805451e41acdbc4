# SPDX-License-Identifier: Apache-2.0
"""Build programs run as another uid (65534) by the permission tests.

Another uid must be able to reach the program and the library it loads
(RUNPATH $ORIGIN/../../lib). A clone under /root (mode 700), as on a plain
Debian run as root, is not reachable: there the program and the library
are copied once, in the same relative layout, to a directory every uid can
read, removed when the test process exits.
"""
import atexit
import os
import shutil
import stat
import tempfile

_copies: "dict[str, str]" = {}


def _reachable(path: str) -> bool:
    """Every directory above @path searchable, and @path readable, by others."""
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    while True:
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return False
        if d == "/":
            break
        d = os.path.dirname(d)
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def for_other_uid(program: str) -> str:
    """@program (a build path such as build/examples/gfctl/gfctl), as a path
    uid 65534 can run."""
    program = os.path.abspath(program)
    lib = os.path.normpath(os.path.join(os.path.dirname(program), "..", "..", "lib"))
    if _reachable(program) and _reachable(os.path.join(lib, "libgpufailover.so.0")):
        return program
    if program not in _copies:
        top = tempfile.mkdtemp(prefix="gf-other-uid-")
        atexit.register(shutil.rmtree, top, True)
        os.chmod(top, 0o755)
        bindir = os.path.join(top, "bin", os.path.basename(os.path.dirname(program)))
        for d in (os.path.join(top, "bin"), bindir, os.path.join(top, "lib")):
            os.mkdir(d)
            os.chmod(d, 0o755)  # whatever the umask
        for name in os.listdir(lib):
            if name.startswith("libgpufailover.so") and os.path.isfile(os.path.join(lib, name)):
                shutil.copy2(os.path.join(lib, name), os.path.join(top, "lib", name), follow_symlinks=True)
        copy = os.path.join(bindir, os.path.basename(program))
        shutil.copy2(program, copy)
        os.chmod(copy, 0o755)
        _copies[program] = copy
    return _copies[program]
