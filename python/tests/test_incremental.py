"""Incremental checkpoints through the Python package: a save against a base writes only what
changed, through hyperdcp's API and torch's keyword path; a LoRA-style job saving every step
into an incremental manager, SIGKILLed at random points, always resumes bit for bit."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

import hyperdcp as dcp

WORKER = os.path.join(os.path.dirname(__file__), "workers", "lora_job.py")


def frozen_and_trained(step: int) -> dict:
    g = torch.Generator().manual_seed(0)
    return {"frozen": {f"layer{i}": torch.randn(256, 256, generator=g) for i in range(8)},
            "adapter": torch.full((4, 256), float(step)), "step": step}


def test_a_save_against_a_base_writes_only_what_changed(tmp_path, monkeypatch):
    dcp.save(frozen_and_trained(1), tmp_path / "step_1", no_dist=True)
    r = dcp.save(frozen_and_trained(2), tmp_path / "step_2", no_dist=True,
                 incremental_base=tmp_path / "step_1")
    frozen_bytes = 8 * 256 * 256 * 4
    assert r.bytes_referenced == frozen_bytes and r.chunks_referenced == 8
    assert r.bytes_written < 4 * 256 * 4 + 1024
    got = frozen_and_trained(0)
    dcp.load(got, tmp_path / "step_2", no_dist=True)
    want = frozen_and_trained(2)
    assert all(torch.equal(got["frozen"][k], want["frozen"][k]) for k in want["frozen"])
    assert torch.equal(got["adapter"], want["adapter"]) and got["step"] == 2
    # A relative base next to an absolute checkpoint is the same sibling.
    monkeypatch.chdir(tmp_path)
    r3 = dcp.async_save(frozen_and_trained(3), tmp_path / "step_3", no_dist=True,
                        incremental_base="step_2").result()
    assert r3.bytes_referenced == frozen_bytes
    # Not a sibling: one clear error, nothing written.
    with pytest.raises(dcp.DcpError, match="must be a sibling"):
        dcp.save(frozen_and_trained(4), tmp_path / "sub" / "step_4", no_dist=True,
                 incremental_base=tmp_path / "step_3")
    assert not (tmp_path / "sub").exists()


def test_torch_keyword_path_takes_incremental_base(tmp_path):
    import torch.distributed.checkpoint as tdcp

    dcp.install()
    try:
        tdcp.save(frozen_and_trained(1), checkpoint_id=str(tmp_path / "a"), no_dist=True)
        r = tdcp.save(frozen_and_trained(2), checkpoint_id=str(tmp_path / "b"), no_dist=True,
                      incremental_base=str(tmp_path / "a"))
        assert r.bytes_referenced == 8 * 256 * 256 * 4
        got = frozen_and_trained(0)
        tdcp.load(got, checkpoint_id=str(tmp_path / "b"), no_dist=True)
        assert torch.equal(got["adapter"], frozen_and_trained(2)["adapter"])
    finally:
        dcp.uninstall()


def test_the_manager_writes_only_the_adapter(tmp_path):
    with dcp.CheckpointManager(tmp_path / "root", keep_last=2, incremental=True, full_every=3,
                               no_dist=True) as mgr:
        written = [mgr.save(s, frozen_and_trained(s)).bytes_written for s in range(1, 5)]
    full = 8 * 256 * 256 * 4
    assert written[0] >= full and written[3] >= full  # full saves: the first and every third
    assert written[1] < full // 100 and written[2] < full // 100
    with dcp.CheckpointManager(tmp_path / "root", keep_last=2, no_dist=True) as mgr:
        assert mgr.steps() == [1, 3, 4]  # 3 keeps 1, whose frozen bytes it references
        for s in mgr.steps():
            got = frozen_and_trained(0)
            mgr.load(got, step=s)
            assert torch.equal(got["adapter"], frozen_and_trained(s)["adapter"])



def test_with_a_memory_tier_the_drains_write_only_the_adapter(tmp_path):
    tier = dcp.MemoryTier(dir=str(tmp_path / "shm"), keep_last=2, persist_every=1)
    with dcp.CheckpointManager(tmp_path / "root", keep_last=2, memory_tier=tier,
                               incremental=True, no_dist=True) as mgr:
        for s in range(1, 4):
            mgr.save(s, frozen_and_trained(s))
        got = frozen_and_trained(0)
        assert mgr.load(got).from_memory and torch.equal(got["adapter"],
                                                         frozen_and_trained(3)["adapter"])

    def on_disk(step):
        d = tmp_path / "root" / f"step_{step:09d}"
        return sum(f.stat().st_size for f in d.iterdir() if f.suffix == ".safetensors")

    full = 8 * 256 * 256 * 4
    assert on_disk(1) >= full and on_disk(2) < full // 100 and on_disk(3) < full // 100
    # Without the tier, every drained step loads from the root alone.
    with dcp.CheckpointManager(tmp_path / "root", keep_last=2, no_dist=True) as mgr:
        assert mgr.steps() == [1, 2, 3]
        for s in mgr.steps():
            got = frozen_and_trained(0)
            mgr.load(got, step=s)
            want = frozen_and_trained(s)
            assert torch.equal(got["adapter"], want["adapter"]) and got["step"] == s
            assert all(torch.equal(got["frozen"][k], want["frozen"][k]) for k in want["frozen"])

def run_job(root, steps, kill_after=None):
    """Runs the job; with kill_after, SIGKILLs it that many seconds after its first save."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, WORKER, str(root), "--steps", str(steps)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    if kill_after is None:
        out, _ = p.communicate(timeout=600)
        return p.returncode, out
    lines = []
    for line in p.stdout:  # wait for the first save, then let it run a little
        lines.append(line)
        if line.startswith("saved") or line.startswith("RESUMED") or line.startswith("KEPT"):
            break
    time.sleep(kill_after)
    p.send_signal(signal.SIGKILL)
    rest, _ = p.communicate(timeout=600)
    return p.returncode, "".join(lines) + rest


def test_a_lora_job_killed_at_random_points_resumes_bit_for_bit(tmp_path):
    root = tmp_path / "root"
    rng = random.Random(20261205)
    for attempt in range(5):
        code, out = run_job(root, steps=40, kill_after=rng.uniform(0.0, 0.4))
        assert "WRONG" not in out, out
        assert code in (0, -signal.SIGKILL), out
    code, out = run_job(root, steps=40)
    assert code == 0, out
    assert "resumed" in out, out  # the first killed run had saved a step before its kill


def test_every_reader_follows_references_and_exports_are_self_contained(tmp_path, dcp_cli):
    import shutil

    import torch.distributed.checkpoint as tdcp
    from safetensors.torch import load_file

    dcp.save(frozen_and_trained(1), tmp_path / "step_1", no_dist=True)
    dcp.save(frozen_and_trained(2), tmp_path / "step_2", no_dist=True,
             incremental_base=tmp_path / "step_1")
    want = frozen_and_trained(2)
    opened = dcp.load_all(tmp_path / "step_2", no_dist=True)
    assert all(torch.equal(opened["frozen"][k], want["frozen"][k]) for k in want["frozen"])
    assert opened["step"] == 2
    shown = subprocess.run([dcp_cli, "inspect", str(tmp_path / "step_2")], capture_output=True,
                           text=True)
    assert "references: 1 file" in shown.stdout and "step_1" in shown.stdout, shown.stdout
    dcp.to_torch_dcp(tmp_path / "step_2", tmp_path / "torch")
    hf = subprocess.run([dcp_cli, "convert", str(tmp_path / "step_2"), str(tmp_path / "hf"),
                         "--to", "hf", "--quiet"], capture_output=True, text=True)
    assert hf.returncode == 0, hf.stdout + hf.stderr
    shutil.rmtree(tmp_path / "step_1")  # the exports reference nothing
    got = frozen_and_trained(0)
    tdcp.load(got, checkpoint_id=str(tmp_path / "torch"))
    assert all(torch.equal(got["frozen"][k], want["frozen"][k]) for k in want["frozen"])
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert torch.equal(tensors["frozen.layer3"], want["frozen"]["layer3"])
    # The incremental step itself now fails, naming its base's missing file.
    with pytest.raises(dcp.DcpError, match="step_1"):
        dcp.load(frozen_and_trained(0), tmp_path / "step_2", no_dist=True)
