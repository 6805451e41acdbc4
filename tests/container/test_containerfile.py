# SPDX-License-Identifier: Apache-2.0
"""examples/container/Containerfile, the recipe of the sidecar image the
Kubernetes examples name: built when a container builder and its base
images are here (no registry is reached from tests), and otherwise checked:
it installs, with meson, every program the manifests run from that image;
its runtime stage installs the Debian package of every shared library
those programs and libgpufailover.so need; its build stage installs
nothing tests/setup.sh does not."""
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

SOURCE = pathlib.Path(os.environ.get("GF_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
BUILD = pathlib.Path(os.environ.get("GF_BUILD_ROOT", SOURCE / "build"))
CONTAINERFILE = SOURCE / "examples" / "container" / "Containerfile"
IMAGE = "ghcr.io/example/libgpufailover"


def stages():
    """[(base image, [RUN/COPY lines joined])] of the Containerfile."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            out.append((line.split()[1], []))
        elif line and not line.startswith("#"):
            out[-1][1].append(line)
    return out


def apt_packages(lines):
    pkgs = set()
    for l in lines:
        for m in re.finditer(r"apt-get install ([^&]*)", l):
            pkgs |= {w for w in m.group(1).split() if not w.startswith("-")}
    return pkgs


def programs_the_manifests_run():
    progs = set()
    for path in (SOURCE / "examples" / "k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "Pod":
                continue
            spec = doc["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                if not c["image"].startswith(IMAGE + ":"):
                    continue
                progs.add(c["command"][0])
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    cmd = c.get(probe, {}).get("exec", {}).get("command")
                    if cmd:
                        progs.add(cmd[0])
    return progs


def installed():
    return json.loads((BUILD / "meson-info" / "intro-installed.json").read_text())


def test_the_manifests_use_this_image():
    assert {"gf-lockd", "gmsd-entrypoint.sh", "gfctl"} <= programs_the_manifests_run()


def test_it_installs_every_program_the_manifests_run():
    bindir = {pathlib.PurePath(d).name: s for s, d in installed().items() if "/bin/" in d}
    missing = programs_the_manifests_run() - bindir.keys()
    assert not missing, f"meson installs no {sorted(missing)} into bindir"
    (build, build_lines), (runtime, runtime_lines) = stages()
    text = " ".join(build_lines)
    assert "meson setup" in text and "--prefix=/usr" in text and "meson install" in text and "DESTDIR=/out" in text
    assert any(re.fullmatch(r"COPY --from=build /out/usr/ /usr/", l) for l in runtime_lines), runtime_lines
    # The programs must run in the image: it calls each once.
    for prog in programs_the_manifests_run() - {"gmsd-entrypoint.sh"}:
        assert any(f"{prog} --version" in l for l in runtime_lines), prog


def needed(path):
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, timeout=30).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


def package_of(lib):
    r = subprocess.run(["dpkg", "-S", f"*/{lib}"], capture_output=True, text=True, timeout=30)
    return r.stdout.split(":")[0] if r.returncode == 0 else None


def test_runtime_stage_has_every_shared_library():
    if not shutil.which("readelf") or not shutil.which("dpkg"):
        pytest.skip("needs readelf and dpkg (a Debian build machine)")
    bins = [BUILD / "examples" / d / d for d in ("gf-lockd", "gf-gmsd", "gfctl", "gf-supervise")]
    libs = set().union(*(needed(b) for b in bins + sorted(BUILD.glob("lib/libgpufailover.so.*.*"))))
    libs = {l for l in libs if not l.startswith("libgpufailover")}
    (_, _), (_, runtime_lines) = stages()
    have = apt_packages(runtime_lines) | {"libc6"}  # essential in every Debian image
    missing = {l: package_of(l) for l in libs if package_of(l) not in have}
    assert not missing, f"the runtime stage lacks the packages of {missing}"


def test_build_stage_installs_what_setup_installs():
    setup = (SOURCE / "tests" / "setup.sh").read_text()
    block = setup.split("packages=(\n", 1)[1].split("\n)\n", 1)[0]
    setup_pkgs = {w for line in block.splitlines() for w in line.split("#", 1)[0].split()}
    (_, build_lines), _ = stages()
    extra = apt_packages(build_lines) - setup_pkgs
    assert not extra, f"the build stage installs {sorted(extra)}, which tests/setup.sh does not: keep them alike"


def builder():
    for tool in ("podman", "buildah", "docker"):
        path = shutil.which(tool)
        if path and subprocess.run([path, "info"], capture_output=True, timeout=60).returncode == 0:
            return tool, path
    return None, None


def test_image_builds_where_a_builder_and_the_base_images_are():
    tool, path = builder()
    if not tool:
        pytest.skip("no working podman, buildah or docker: the checks above stand in for a build")
    for base, _ in stages():
        inspect = [path, "image", "inspect", base] if tool != "buildah" else [path, "inspect", base]
        if subprocess.run(inspect, capture_output=True, timeout=60).returncode != 0:
            pytest.skip(f"base image {base} is not here, and tests pull nothing")
    cmd = [path, "bud" if tool == "buildah" else "build", "--pull=never" if tool != "docker" else "--pull=false",
           "-f", str(CONTAINERFILE), "-t", "gf-sidecar-test", str(SOURCE)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
