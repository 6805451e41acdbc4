# SPDX-License-Identifier: Apache-2.0
"""gpufailover.vllm.serve's early check, before vLLM starts: the lock
server and the GMS of every local rank answer (tensor x pipeline parallel
of vLLM's arguments, one per {rank}); a rank whose GMS is missing ends the
launcher with 69 and names its URI. No vLLM is needed: the check runs
before vLLM is imported."""
import argparse

import pytest

from gpufailover.vllm import serve


@pytest.mark.parametrize("argv,ranks", [
    (["m"], 1),
    (["m", "--tensor-parallel-size", "2"], 2),
    (["m", "-tp=4", "--pipeline-parallel-size=2"], 8),
    (["m", "-tp", "2", "-pp", "2"], 4),
    (["m", "-tp", "2", "--nnodes", "2"], 1),
    (["m", "-tp", "2", "--data-parallel-size=2"], 1),
    (["m", "-tp", "two"], 1),
    (["m", "-tp"], 1),
    (["m", "-tp", "0"], 1),
])
def test_local_ranks(argv, ranks):
    assert serve.local_ranks(argv) == ranks


def args(cluster, gms, lock=None, secret=None, secret_file=None):
    return argparse.Namespace(lock=lock or cluster.lock_uri, gms=gms, check_timeout=1.0, lock_secret=secret,
                              lock_secret_file=secret_file)


def test_every_rank_gms_is_checked(cluster, capsys):
    cluster.lockd()
    cluster.gmsd(0)
    gms = f"unix://{cluster.dir}/gms{{rank}}.sock"
    serve.check_servers(args(cluster, gms), ["m"])  # rank 0 alone: it answers
    with pytest.raises(SystemExit) as e:
        serve.check_servers(args(cluster, gms), ["m", "-tp", "2"])
    assert e.value.code == serve.EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert cluster.gms_uri(1) in err and "does not answer" in err, err
    cluster.gmsd(1)
    serve.check_servers(args(cluster, gms), ["m", "-tp", "2"])


def test_a_gms_without_rank_is_asked_once(cluster):
    cluster.lockd()
    cluster.gmsd(0)
    serve.check_servers(args(cluster, cluster.gms_uri(0)), ["m", "-tp", "4"])


def test_lock_secret_file_is_read_once_and_checked(tmp_path, capsys):
    f = tmp_path / "lock.secret"
    f.write_bytes(b"s3cret\r\n")
    a, vllm_argv = serve.parse_args(["serve", "m", "--lock", "tcp://127.0.0.1:1", "--gms", "unix:///g", "--id", "x",
                                     "--lock-secret-file", str(f), "--port", "8000"])
    assert a.lock_secret == b"s3cret"
    assert vllm_argv == ["m", "--port", "8000"]
    a, _ = serve.parse_args(["serve", "m", "--lock", "unix:///l", "--gms", "unix:///g", "--id", "x"])
    assert a.lock_secret is None
    empty = tmp_path / "empty"
    empty.write_bytes(b"\n")
    for path, what in ((tmp_path / "none", "No such file"), (empty, "empty secret")):
        with pytest.raises(SystemExit) as e:
            serve.parse_args(["serve", "m", "--lock", "tcp://127.0.0.1:1", "--gms", "unix:///g", "--id", "x",
                              "--lock-secret-file", str(path)])
        assert e.value.code == serve.EXIT_USAGE
        err = capsys.readouterr().err
        assert f"--lock-secret-file {path}: {what}" in err, err


def test_tcp_lock_is_pinged_with_the_secret(cluster, tmp_path, capsys):
    import socket
    import gpufailover as gf
    from conftest import LOCKD, wait_for
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        uri = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    secret_file = tmp_path / "lock.secret"
    secret_file.write_bytes(b"vllm-check-secret\n")
    cluster.spawn("gf-lockd-tcp", [LOCKD, f"--listen={uri}", f"--state-file={tmp_path}/tcp.state",
                                   f"--secret-file={secret_file}"])
    wait_for(lambda: gf.lock_ping(uri, 0.2, secret=b"vllm-check-secret") is None, what="gf-lockd on tcp")
    cluster.gmsd(0)
    serve.check_servers(args(cluster, cluster.gms_uri(0), uri, b"vllm-check-secret", str(secret_file)), ["m"])
    for secret, hint in ((None, "a tcp:// lock server needs --lock-secret-file"),
                         (b"wrong", f"check --lock-secret-file {secret_file}")):
        with pytest.raises(SystemExit) as e:
            serve.check_servers(args(cluster, cluster.gms_uri(0), uri, secret, str(secret_file)), ["m"])
        assert e.value.code == serve.EXIT_USAGE
        err = capsys.readouterr().err
        assert f"--lock {uri}: the lock server refuses this member" in err and hint in err, err
