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

    import hyperdcp as dcp

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


def test_dtensor_on_a_submesh(torchrun, tmp_path):
    """Saved and loaded by the ranks of its mesh only; opened whole in one process."""
    import torch

    import hyperdcp as dcp

    out = torchrun(2, "submesh.py", tmp_path)
    assert out.count(": ok") == 2, out
    got = dcp.load_all(tmp_path / "ck")
    assert torch.equal(got["submesh_sdt"], torch.arange(24.0).reshape(6, 4))
    assert torch.equal(got["sdt"], 2 * torch.arange(24.0).reshape(6, 4)) and got["step"] == 5


def test_read_once_broadcast_and_subgroups(torchrun, tmp_path):
    out = torchrun(4, "broadcast.py", tmp_path)
    assert out.count(": ok") == 4, out


def test_gloo_collectives_of_every_size(torchrun, tmp_path):
    """all_gather, gather and broadcast over hyperdcp's gloo groups, messages of every size
    class (one round or two) differing between ranks in the same call."""
    out = torchrun(3, "gloo_collectives.py")
    assert out.count("collectives ok") == 3, out


def test_bench_against_torch_dcp_runs(torchrun, tmp_path):
    """`python -m hyperdcp.bench` at a tiny size (so it cannot rot): both libraries' loads are
    checked against the saved values inside the bench (a mismatch fails the job), and the
    table and the JSON name every phase with a time for each repetition."""
    import json

    out_json = tmp_path / "bench.json"
    out = torchrun(2, "-m hyperdcp.bench", "--size-mb", "1", "--hidden", "32", "--repeat", "2",
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


def test_torch_dcp_training_script_runs_unchanged(torchrun, tmp_path):
    """workers/train_dropin.py, a torch.distributed.checkpoint script (FSDP2, AdamW, LR
    scheduler, dataloader position, RNG states; save, async_save + add_done_callback, load),
    with `import hyperdcp as dcp`: resuming from step 3 gives steps 4-6 and the final
    parameters bit for bit, and the same as the script on torch DCP itself."""
    import json

    def report(d: Path, mode: str, rank: int) -> dict:
        r = json.loads((d / f"{mode}.rank{rank}.json").read_text())
        return {k: v for k, v in r.items() if k in ("step 4", "step 5", "step 6", "digest",
                                                     "loader")}

    runs = {}
    for lib in ("hyperdcp", "torch"):
        fresh = torchrun(2, "train_dropin.py", lib, "fresh", tmp_path / lib)
        resumed = torchrun(2, "train_dropin.py", lib, "resume", tmp_path / lib)
        assert fresh.count(": ok") == 2 and resumed.count(": ok") == 2, fresh + resumed
        for rank in range(2):
            want = report(tmp_path / lib, "fresh", rank)
            assert len(want) == 5, want
            assert report(tmp_path / lib, "resume", rank) == want, lib
        runs[lib] = [report(tmp_path / lib, "fresh", r) for r in range(2)]
    assert runs["hyperdcp"] == runs["torch"]


def test_sharded_tensor_saves_as_boxes(torchrun, tmp_path):
    """FSDP1's ShardedTensor: its local shards are chunks (2 ranks, rows -> columns), and the
    checkpoint loads whole in one process."""
    import torch

    import hyperdcp as dcp

    out = torchrun(2, "sharded_tensor.py", tmp_path)
    assert out.count(": ok") == 2, out
    whole = {"w": torch.zeros(6, 8)}
    dcp.load(whole, tmp_path / "st", allow_partial=True)
    assert torch.equal(whole["w"], torch.arange(48, dtype=torch.float32).reshape(6, 8))


def test_memory_tier_restores_after_losing_a_host(torchrun, tmp_path):
    """4 ranks, each its own host: async saves to the memory tier; host h2's memory is lost;
    3 ranks on the surviving hosts restore the newest step with another layout, from memory."""
    import glob
    import shutil
    root, tier = tmp_path / "ckpt", tmp_path / "shm"
    torchrun(4, "tier_job.py", root, tier, "h0,h1,h2,h3", "save")
    lost = glob.glob(str(tier / "root-*" / "h2"))
    assert len(lost) == 1, lost
    shutil.rmtree(lost[0])
    out = torchrun(3, "tier_job.py", root, tier, "h0,h1,h3", "restore")
    assert "restored step 3 from memory" in out, out
