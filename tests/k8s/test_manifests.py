# SPDX-License-Identifier: Apache-2.0
"""Checks the Kubernetes example manifests for the properties the failover
design depends on: every referenced volume, port, claim and socket path
exists and agrees, and the timeouts are consistent."""
import os
import re
import pathlib

import pytest
import yaml

K8S_DIR = pathlib.Path(os.environ.get("GF_SOURCE_ROOT", pathlib.Path(__file__).parents[2])) / "examples" / "k8s"


def load_docs():
    docs = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def duration_s(text):
    m = re.fullmatch(r"(\d+)(ms|s|m)", text)
    assert m, f"bad duration {text!r}"
    n, unit = int(m.group(1)), m.group(2)
    return n / 1000 if unit == "ms" else n * 60 if unit == "m" else n


def flag(container, name):
    for a in container.get("args", []) + container.get("command", []):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


@pytest.fixture(scope="module")
def docs():
    d = load_docs()
    assert d, f"no manifests in {K8S_DIR}"
    return d


def pods(docs):
    return [d for d in docs if d["kind"] == "Pod"]


POD_NAMES = [d["metadata"]["name"] for d in load_docs() if d["kind"] == "Pod"]


@pytest.fixture(scope="module", params=POD_NAMES)
def pod(request, docs):
    return next(d for d in pods(docs) if d["metadata"]["name"] == request.param)["spec"]


def test_both_pods_are_shipped():
    assert {"llm-failover", "vllm-failover"} <= set(POD_NAMES)


def all_containers(pod):
    return pod.get("initContainers", []) + pod["containers"]


def sidecar(pod, name):
    return next(c for c in pod["initContainers"] if c["name"] == name)


def test_shared_process_namespace(pod):
    # The lock server must see engine pids to wait for their exit.
    assert pod["shareProcessNamespace"] is True


def test_sidecars_are_native_and_gated_by_gfctl(pod):
    names = {c["name"]: c for c in pod["initContainers"]}
    assert {"gf-lockd", "gf-gmsd"} <= set(names)
    for c in names.values():
        assert c["restartPolicy"] == "Always"
        cmd = c["startupProbe"]["exec"]["command"]
        assert cmd[0] == "gfctl"


def test_volumes_exist_and_sockets_live_on_memory_emptydir(pod):
    vols = {v["name"]: v for v in pod["volumes"]}
    for c in all_containers(pod):
        for m in c.get("volumeMounts", []):
            assert m["name"] in vols, f"{c['name']} mounts unknown volume {m['name']}"
    run = vols["gf-run"]
    assert run["emptyDir"]["medium"] == "Memory"
    # Every unix socket and the state file a container names must be on a mount of gf-run.
    for c in all_containers(pod):
        mounts = [m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] == "gf-run"]
        text = " ".join(c.get("args", []) + c.get("command", []))
        probe = c.get("startupProbe", {}).get("exec", {}).get("command", [])
        text += " " + " ".join(probe)
        for path in re.findall(r"unix://(/[^\s\"',]+)", text) + re.findall(r"--state-file=(\S+)", text):
            assert any(path.startswith(mp.rstrip("/") + "/") for mp in mounts), f"{c['name']}: {path} not on gf-run"


def test_engines_agree_with_sidecars_on_socket_paths(pod):
    listen = flag(sidecar(pod, "gf-lockd"), "listen")
    engines = pod["containers"]
    assert len(engines) == 2
    gmsd = sidecar(pod, "gf-gmsd")
    env = {e["name"]: e["value"] for e in gmsd.get("env", [])}
    sock_dir = env["GF_GMS_SOCKET_DIR"]
    mounts = [m["mountPath"] for m in gmsd["volumeMounts"] if m["name"] == "gf-run"]
    assert sock_dir in mounts
    # gmsd-entrypoint.sh serves device D at $GF_GMS_SOCKET_DIR/gms-D.sock
    served = {f"unix://{sock_dir}/gms-{d}.sock" for d in gmsd["args"]}
    probe = gmsd["startupProbe"]["exec"]["command"]
    assert probe[probe.index("--gms") + 1] in served
    for e in engines:
        assert flag(e, "lock") == listen
        # the vLLM launcher names one GMS per rank: {rank} is the device of a one-GPU server
        assert flag(e, "gms").replace("{rank}", "0") in served


def test_engines_are_symmetric(pod):
    a, b = pod["containers"]
    assert a["image"] == b["image"] and a.get("command") == b.get("command")
    strip = lambda c: sorted(re.sub(r"(engine-|http-|probe-)[ab]|=[ab]$|80\d\d|follower|loader", "X", x)
                             for x in c["args"])
    assert strip(a) == strip(b)
    assert {flag(a, "role"), flag(b, "role")} == {"loader", "follower"}


def listener_ports(lockd):
    """{name: port} of gf-lockd's --listener=NAME=tcp://ADDR:PORT flags."""
    out = {}
    for a in lockd["args"]:
        m = re.fullmatch(r"--listener=([\w-]+)=tcp://[^:]+:(\d+)", a)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def served_ports(c):
    """The TCP ports a container's program listens on, read from its flags."""
    ports = set()
    if c["name"] == "gf-lockd":
        ports |= set(listener_ports(c).values())
    for name in ("probe-port", "port", "metrics", "http"):
        v = flag(c, name)
        if v:
            ports.add(int(v.rsplit(":", 1)[-1]))
    return ports


def probe_port(c, probe):
    get = c[probe]["httpGet"]
    declared = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    return declared[get["port"]] if isinstance(get["port"], str) else get["port"]


def test_served_through_the_locks_listener(docs, pod):
    lockd = sidecar(pod, "gf-lockd")
    listeners = listener_ports(lockd)
    assert "http" in listeners, "gf-lockd must carry the serving socket (--listener=http=tcp://...)"
    port = listeners["http"]
    assert {p["containerPort"] for p in lockd["ports"]} >= {port}, "gf-lockd must declare the listener's port"
    # The Service that selects this pod targets the listener, not an engine.
    labels = next(d for d in pods(docs) if d["spec"] is pod)["metadata"]["labels"]
    services = [d for d in docs if d["kind"] == "Service" and d["spec"]["selector"].items() <= labels.items()]
    assert len(services) == 1, f"one Service must select {labels}"
    (svc_port,) = services[0]["spec"]["ports"]
    assert svc_port["targetPort"] == port
    for e in pod["containers"]:
        assert flag(e, "listener") == "http", f"{e['name']} must serve from the lock's listener"
        assert port not in served_ports(e), f"{e['name']} binds the Service's port {port} itself"
        assert port not in {p["containerPort"] for p in e.get("ports", [])}


def test_probes_hit_ports_their_container_serves(pod):
    for c in all_containers(pod):
        declared = {p["containerPort"] for p in c.get("ports", [])}
        assert declared <= served_ports(c), f"{c['name']} declares a port nothing in it listens on"
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            if "httpGet" in c.get(probe, {}):
                assert probe_port(c, probe) in served_ports(c), f"{c['name']} {probe}: a port it does not serve"
    # Containers of a pod share one network namespace: no port twice.
    every = [p for c in all_containers(pod) for p in served_ports(c)]
    assert len(every) == len(set(every)), f"a port is served twice in the pod: {sorted(every)}"


def test_probes_use_the_state_table_paths(pod):
    for c in pod["containers"]:
        for probe, path in (("startupProbe", "/startup"), ("livenessProbe", "/live"), ("readinessProbe", "/ready")):
            assert c[probe]["httpGet"]["path"] == path
        # Startup covers model loading (Decision 2: ~2 h budget).
        s = c["startupProbe"]
        assert s["periodSeconds"] * s["failureThreshold"] >= 3600


def test_gpu_shared_through_one_claim(docs, pod):
    templates = {d["metadata"]["name"] for d in docs if d["kind"] == "ResourceClaimTemplate"}
    claims = {c["name"]: c["resourceClaimTemplateName"] for c in pod["resourceClaims"]}
    assert len(claims) == 1
    assert set(claims.values()) <= templates
    users = [c["name"] for c in all_containers(pod) if c.get("resources", {}).get("claims")]
    for c in all_containers(pod):
        for claim in c.get("resources", {}).get("claims", []):
            assert claim["name"] in claims
    assert {"gf-gmsd"} | {c["name"] for c in pod["containers"]} <= set(users)


def test_timeouts_are_consistent(pod):
    lockd = sidecar(pod, "gf-lockd")
    window = duration_s(flag(lockd, "reconnect-window"))
    exit_wait = duration_s(flag(lockd, "exit-wait-timeout"))
    grace = pod["terminationGracePeriodSeconds"]
    # A pod being deleted must have time for the holder to exit and the lock to pass.
    assert grace > exit_wait
    for c in pod["containers"]:
        waking = duration_s(flag(c, "waking-timeout"))
        live = c["livenessProbe"]
        # A hung wake is caught by /live after the waking timeout, not by the startup probe.
        assert waking > live["periodSeconds"] * live["failureThreshold"]
        # The fail-fast bound on waiting for a commit is set, and ends Init
        # (the engine exits, the restarts show it) before kubelet's startup
        # budget would.
        init = duration_s(flag(c, "init-timeout"))
        s = c["startupProbe"]
        assert 0 < init < s["periodSeconds"] * s["failureThreshold"]
        # A member's SIGTERM drains what it accepted (gf-vllm): before kubelet's SIGKILL.
        if any(a.startswith("--drain-timeout") for a in c["args"]):
            assert duration_s(flag(c, "drain-timeout")) < grace
    assert window > 0


def test_vllm_pod_runs_the_packaged_launcher(docs):
    (pod,) = [d["spec"] for d in pods(docs) if d["metadata"]["name"] == "vllm-failover"]
    for c in pod["containers"]:
        assert c["command"] == ["gf-vllm"] and c["args"][0] == "serve" and not c["args"][1].startswith("-")
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/run/gf", "/dev/shm"}
    assert sorted(int(flag(c, "probe-port")) for c in pod["containers"]) == [8091, 8092]
    assert sorted(flag(c, "id") for c in pod["containers"]) == ["a", "b"]


def documented_minimum():
    """The minimum Kubernetes version docs/operations.md states for the example."""
    text = (K8S_DIR.parents[1] / "docs" / "operations.md").read_text()
    m = re.search(r"needs Kubernetes ≥ (\d+)\.(\d+)", text)
    assert m, "docs/operations.md must state the example's minimum Kubernetes version"
    return int(m.group(1)), int(m.group(2))


def schema_errors(docs, version):
    kv = pytest.importorskip("kubernetes_validate")
    errors = []
    for d in docs:
        try:
            kv.validate(d, version, strict=True)
        except Exception as e:  # SchemaNotFoundError (kind unknown there), ValidationError
            errors.append(f"{d['kind']}/{d['metadata']['name']} @ {version}: {type(e).__name__} {e}")
    return errors


def test_manifests_validate_strictly_against_the_real_schemas(docs):
    kv = pytest.importorskip("kubernetes_validate")
    for version in ("1.34", kv.latest_version()):
        assert schema_errors(docs, version) == []


def test_documented_minimum_version_is_the_real_one(docs):
    major, minor = documented_minimum()
    assert schema_errors(docs, f"{major}.{minor}") == []
    assert schema_errors(docs, f"{major}.{minor - 1}") != []


def test_dra_claim_is_ga_with_exactly(docs):
    templates = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    assert templates
    for t in templates:
        assert t["apiVersion"] == "resource.k8s.io/v1"
        for req in t["spec"]["spec"]["devices"]["requests"]:
            assert "deviceClassName" in req["exactly"]
