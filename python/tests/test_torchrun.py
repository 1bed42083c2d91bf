"""Multi-process tests: real torchrun jobs on gloo (CPU)."""

from pathlib import Path

import pytest


def test_reshard_4_ranks_then_2_ranks(torchrun, tmp_path):
    out = torchrun(4, "reshard.py", tmp_path)
    assert out.count(": ok") == 4, out
    out = torchrun(2, "reshard.py", tmp_path, "load-only")
    assert out.count(": ok") == 2, out


def test_one_rank_failing_fails_every_rank(torchrun, tmp_path):
    out = torchrun(4, "failures.py", tmp_path)
    assert out.count(": ok") == 4, out


@pytest.mark.parametrize("nproc, worker, steps", [(2, "fsdp_save.py", 3),
                                                   (4, "fsdp_tp_save.py", 2)])
def test_fsdp2_adamw_to_one_process(torchrun, tmp_path, nproc, worker, steps):
    """FSDP2 (2 ranks) or FSDP2 x TP (2x2) -> a plain module in this process: every
    parameter and optimizer state tensor equal exactly."""
    import sys

    import torch

    out = torchrun(nproc, worker, tmp_path)
    assert out.count(": ok") == nproc, out

    sys.path.insert(0, str(Path(__file__).parent / "workers"))
    import model as m

    import dcp

    net = m.make_model()
    optim = m.make_optimizer(net)
    m.train(net, optim, steps=1)  # optimizer state exists, with other values
    sd = m.state(net, optim)
    dcp.load(sd, tmp_path / "ckpt")
    m.restore(net, optim, sd)
    ref = torch.load(tmp_path / "ref.pt", weights_only=True)
    m.assert_equal(m.full_state(net, optim), ref)
    assert optim.state_dict()["state"][0]["step"].item() == steps
    m.train(net, optim, steps=1)  # training goes on


def test_read_once_broadcast_and_subgroups(torchrun, tmp_path):
    out = torchrun(4, "broadcast.py", tmp_path)
    assert out.count(": ok") == 4, out


def test_bench_against_torch_dcp_runs(torchrun, tmp_path):
    """`python -m dcp.bench` at a tiny size (so it cannot rot): both libraries' loads are
    checked against the saved values inside the bench (a mismatch fails the job), and the
    table and the JSON name every phase with a time for each repetition."""
    import json

    out_json = tmp_path / "bench.json"
    out = torchrun(2, "-m dcp.bench", "--size-mb", "1", "--hidden", "32", "--repeat", "2",
                   "--pause", "0", "--dir", tmp_path / "scratch", "--json", out_json)
    doc = json.loads(out_json.read_text())
    assert doc["ranks"] == 2 and doc["repeat"] == 2, doc
    assert doc["unique_bytes"] > doc["replicated_bytes"] > 0, doc
    for phase in ("save", "load.cold", "load.warm", "reshard", "async.blocked", "async.total"):
        assert phase in out, out
        p = doc["phases"][phase]
        assert len(p["dcp_seconds_each"]) == 2 and len(p["torch_seconds_each"]) == 2, p
        assert p["dcp_seconds"] > 0 and p["torch_seconds"] > 0, p
    assert not (tmp_path / "scratch" / "ckpt").exists()  # the bench cleans up after itself
