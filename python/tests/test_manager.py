"""dcp.CheckpointManager in one process: steps, latest, retention, resume, the lock."""

import os
import time

import pytest
import torch

import hyperdcp as dcp


def state(step: int) -> dict:
    return {"w": torch.arange(16, dtype=torch.float32) + step * 100, "meta": {"step": step}}


def test_saves_retains_and_resumes(tmp_path):
    root = tmp_path / "ckpt"
    with dcp.CheckpointManager(root, keep_last=2, keep_every=4) as mgr:
        assert mgr.latest_step() is None
        mgr.prepare_async_save(state(0))
        for step in range(1, 7):
            if step % 2:
                mgr.save(step, state(step))
            else:
                mgr.async_save(step, state(step))
        mgr.wait()
        assert mgr.steps() == [4, 5, 6]
        assert (root / "latest").read_text().strip() == "6"
        assert sorted(os.listdir(root)) == [".dcp-manager.lock", ".recycle", "latest",
                                            "step_000000004", "step_000000005",
                                            "step_000000006"]
    # Step 6 damaged: a fresh manager resumes from the newest complete step, 5.
    data = [f for f in os.listdir(root / "step_000000006") if f.startswith("data-")]
    for f in data:
        os.truncate(root / "step_000000006" / f, 1)
    with dcp.CheckpointManager(root, keep_last=2) as mgr:
        assert mgr.latest_step() == 5
        got = state(0)
        mgr.load(got)
        assert torch.equal(got["w"], state(5)["w"]) and got["meta"] == {"step": 5}
        mgr.load(got, step=4)
        assert torch.equal(got["w"], state(4)["w"])


@pytest.mark.parametrize("recycle", [True, False])
def test_recycled_files_hold_the_new_step(tmp_path, recycle):
    with dcp.CheckpointManager(tmp_path, keep_last=1, recycle_files=recycle) as mgr:
        results = [mgr.save(step, state(step)) for step in range(1, 5)]
        # Step 1 is retired by step 2's save; step 3 overwrites its file, and so on.
        assert [r.file_recycled for r in results] == [False, False, recycle, recycle]
        assert os.path.exists(tmp_path / ".recycle") == recycle
        got = state(0)
        mgr.load(got)
        assert torch.equal(got["w"], state(4)["w"]) and got["meta"] == {"step": 4}


def test_second_manager_on_one_root_refused(tmp_path):
    with dcp.CheckpointManager(tmp_path, keep_last=1):
        with pytest.raises(dcp.DcpError, match="is in use by manager") as e:
            dcp.CheckpointManager(tmp_path, keep_last=1)
        assert e.value.code == "FAILED_PRECONDITION"
    dcp.CheckpointManager(tmp_path, keep_last=1).close()  # released


def plant_lock(path, host, renewed_ago_s):
    now = int(time.time() * 1000)
    path.write_text(f"dcp lock\nkind manager\nid 77\nhost {host}\npid 4242\n"
                    f"started {now - 9000000:015d}\nrenewed {now - renewed_ago_s * 1000:015d}\n")


def test_a_lock_of_a_gone_host_unlocked_broken_or_expired(tmp_path, capfd):
    lock = tmp_path / ".dcp-manager.lock"
    plant_lock(lock, "gone-host", renewed_ago_s=5)
    with pytest.raises(dcp.DcpError, match="process 4242 on host gone-host"):
        dcp.CheckpointManager(tmp_path)
    with pytest.raises(ValueError, match="lock_lease_seconds"):
        dcp.CheckpointManager(tmp_path, lock_lease_seconds=0)
    # A person who knows: unlock, or break_lock.
    assert dcp.unlock(tmp_path) == [f"{lock} (held by manager 77 of process 4242 on host "
                                    "gone-host (started 9000 s ago, renewed 5 s ago))"]
    plant_lock(lock, "gone-host", renewed_ago_s=5)
    dcp.CheckpointManager(tmp_path, break_lock=True).close()
    # Nobody: the lease runs out.
    plant_lock(lock, "gone-host", renewed_ago_s=5)
    capfd.readouterr()
    with dcp.CheckpointManager(tmp_path, lock_lease_seconds=2) as mgr:
        mgr.save(1, state(1))
    err = capfd.readouterr().err
    assert "breaking the lock of checkpoint root" in err and "lease of 2 s expired" in err, err
    with pytest.raises(dcp.DcpError, match="holds no dcp lock"):
        dcp.unlock(tmp_path)


def test_prune_and_keep(tmp_path):
    with dcp.CheckpointManager(tmp_path) as mgr:
        for step in range(1, 6):
            mgr.save(step, state(step))
    with dcp.CheckpointManager(tmp_path, keep_last=1) as mgr:
        mgr.keep(2)
        assert mgr.prune(dry_run=True) == [1, 3, 4]
        assert mgr.steps() == [1, 2, 3, 4, 5]
        assert mgr.prune() == [1, 3, 4]
        assert mgr.steps() == [2, 5]


def test_calls_from_several_threads_take_turns(tmp_path):
    """One thread saves (steps must grow) while another loads the newest step: the engine
    calls take turns instead of racing over the manager's state."""
    import threading

    mgr = dcp.CheckpointManager(tmp_path, keep_last=3)
    mgr.save(0, {"w": torch.zeros(1024), "step": 0})
    errors = []
    done = threading.Event()

    def saver() -> None:
        try:
            for step in range(1, 9):
                mgr.async_save(step, {"w": torch.full((1024,), float(step)), "step": step})
            mgr.wait()
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        finally:
            done.set()

    def loader() -> None:
        try:
            while not done.is_set():
                got = {"w": torch.zeros(1024), "step": -1}
                mgr.load(got)
                assert torch.equal(got["w"], torch.full((1024,), float(got["step"])))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=saver), threading.Thread(target=loader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert mgr.latest_step() == 8 and mgr.steps() == [6, 7, 8]
    mgr.close()


def test_recycling_never_overwrites_a_hard_linked_snapshot(tmp_path):
    """Issue 19's repro: keep_last=1, step 1's data file hard-linked to a backup (as `cp -al`
    snapshots do); saves 2 and 3 recycle retired files: the backup keeps its bytes."""
    import hashlib

    root = tmp_path / "root"
    mgr = dcp.CheckpointManager(root, keep_last=1)
    mgr.save(1, {"w": torch.full((4096,), 1.0)})
    data = next((root / "step_000000001").glob("*.safetensors"))
    backup = tmp_path / "backup.safetensors"
    os.link(data, backup)
    digest = hashlib.sha256(backup.read_bytes()).hexdigest()
    mgr.save(2, {"w": torch.full((4096,), 2.0)})
    mgr.save(3, {"w": torch.full((4096,), 3.0)})
    assert hashlib.sha256(backup.read_bytes()).hexdigest() == digest
    step3 = next((root / "step_000000003").glob("*.safetensors"))
    assert os.stat(step3).st_nlink == 1
    got = {"w": torch.zeros(4096)}
    mgr.load(got)
    assert torch.equal(got["w"], torch.full((4096,), 3.0))
    mgr.close()


@pytest.mark.parametrize("kwargs", [{"keep_last": 0}, {"keep_last": -1}, {"keep_every": 0},
                                    {"keep_every": -5}])
def test_retention_settings_that_delete_everything_are_refused(tmp_path, kwargs):
    with pytest.raises(dcp.DcpError, match="unset") as e:
        dcp.CheckpointManager(tmp_path, **kwargs)
    assert e.value.code == "INVALID_ARGUMENT"
    dcp.CheckpointManager(tmp_path, keep_last=1).close()  # the root was not left locked


def test_resume_falls_back_past_a_corrupt_step(tmp_path):
    with dcp.CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
    for data in (tmp_path / "step_000000002").glob("*.safetensors"):
        blob = bytearray(data.read_bytes())
        blob[-1] ^= 0xFF  # same size: the step still looks complete
        data.write_bytes(bytes(blob))
    with dcp.CheckpointManager(tmp_path) as mgr:
        got = state(0)
        r = mgr.load(got)
        assert r.step == 1 and "step 2" in r.fell_back, r.fell_back
        assert torch.equal(got["w"], state(1)["w"]) and got["meta"]["step"] == 1
        assert mgr.steps() == [1]
    assert (tmp_path / "step_000000002" / "dcp.bad").exists()  # marked, not deleted


def test_memory_tier_in_one_process(tmp_path):
    """Steps in memory, every 2nd in the root; a new manager restores the newest from memory;
    with the memory gone, from the root."""
    tier = dcp.MemoryTier(dir=str(tmp_path / "shm"), persist_every=2, persist_at_exit=False)
    with dcp.CheckpointManager(tmp_path / "ckpt", memory_tier=tier) as mgr:
        for step in (1, 2, 3):
            mgr.async_save(step, state(step))
        mgr.wait()
        assert mgr.steps() == [2] and mgr.memory_steps() == [2, 3]
    with dcp.CheckpointManager(tmp_path / "ckpt",
                               memory_tier={"dir": str(tmp_path / "shm")}) as mgr:
        got = state(0)
        r = mgr.load(got)
        assert (r.step, r.from_memory, r.files_from_storage) == (3, True, 0)
        assert torch.equal(got["w"], state(3)["w"]) and got["meta"] == {"step": 3}
    import shutil
    shutil.rmtree(tmp_path / "shm")
    with dcp.CheckpointManager(tmp_path / "ckpt", memory_tier=tier) as mgr:
        got = state(0)
        r = mgr.load(got)
        assert (r.step, r.from_memory) == (2, False)
        assert torch.equal(got["w"], state(2)["w"])
    with pytest.raises(TypeError, match="memory_tier must be"):
        dcp.CheckpointManager(tmp_path / "other", memory_tier="yes")


def test_a_fresh_optimizer_loads_its_state_through_the_manager(tmp_path):
    """As dcp.load: a Stateful optimizer with no state yet gets the step's state, never an
    empty success."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    with dcp.CheckpointManager(tmp_path / "root", no_dist=True) as mgr:
        mgr.save(1, {"model": model, "optim": opt})
    fresh_model = torch.nn.Linear(4, 4)
    fresh = torch.optim.AdamW(fresh_model.parameters(), lr=0.1)
    with dcp.CheckpointManager(tmp_path / "root", no_dist=True) as mgr:
        mgr.load({"model": fresh_model, "optim": fresh})
    want = opt.state_dict()["state"]
    got = fresh.state_dict()["state"]
    assert got.keys() == want.keys() and len(got) == 2
    for p in want:
        for k in want[p]:
            assert torch.equal(got[p][k], want[p][k]), (p, k)
