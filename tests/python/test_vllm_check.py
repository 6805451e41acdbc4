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


def args(cluster, gms):
    return argparse.Namespace(lock=cluster.lock_uri, gms=gms, check_timeout=1.0)


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
