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
