"""The memory tier under torchrun: every rank pretends to be a host of its own (DCP_HOST_ID
from HOSTS), as a job of one rank per node would be.

Args: ROOT TIER HOSTS MODE -- HOSTS: comma-separated host names, one per rank; MODE "save"
(async saves of steps 1..3 in layout "a", persist_every 2) or "restore" (load the newest
step in layout "b" and check it is step 3's, from memory, with no file from the root).
"""

import os
import sys

import torch.distributed as dist

import layouts


def main() -> None:
    root, tier, hosts, mode = sys.argv[1:5]
    os.environ["DCP_HOST_ID"] = hosts.split(",")[int(os.environ["RANK"])]
    import hyperdcp as dcp  # after DCP_HOST_ID: the engine reads it when a manager opens

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tier_opts = dcp.MemoryTier(dir=tier, persist_every=2, persist_at_exit=False)
    with dcp.CheckpointManager(root, keep_last=2, memory_tier=tier_opts) as mgr:
        if mode == "save":
            for step in (1, 2, 3):
                sd = layouts.state("a", salt=step)
                mgr.async_save(step, sd)
                for t in sd["model"].values():  # the step is staged: training goes on
                    t.to_local().fill_(-1)
            mgr.wait()
            assert mgr.steps() == [2], mgr.steps()
            assert mgr.memory_steps() == [2, 3], mgr.memory_steps()
        else:
            assert mgr.latest_step() == 3, mgr.latest_step()
            sd = layouts.empty_state("b")
            r = mgr.load(sd)
            assert r.step == 3 and r.from_memory, r
            for name, t in sd["model"].items():
                assert t.full_tensor().equal(layouts.full(name, 3)), name
            assert sd["extra"]["step"] == 103, sd["extra"]
            storage = [0] * dist.get_world_size()
            dist.all_gather_object(storage, (r.files_from_storage, r.files_from_peers))
            assert sum(s for s, _ in storage) == 0, storage
            if rank == 0:
                print(f"restored step {r.step} from memory; files from peers "
                      f"{sum(p for _, p in storage)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
