"""Read-once broadcast through the torch comm: every rank plays its own host (DCP_HOST_ID),
so shards held by several ranks are read by one and broadcast over gloo groups that the
engine creates (CreateGroup: the world, and groups of 2 created by their members only).
Also a save and load on a process subgroup.

Args: DIR
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import hyperdcp as dcp


def main() -> None:
    root = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.environ["DCP_HOST_ID"] = f"host{rank}"
    mesh = init_device_mesh("cpu", (2, 2))
    full_a = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    full_b = torch.arange(48, dtype=torch.int32).reshape(6, 8)

    def state(a, b):
        return {"pairs": distribute_tensor(a, mesh, [Replicate(), Shard(0)]),  # 2 holders each
                "all": distribute_tensor(b, mesh, [Replicate(), Replicate()])}  # 4 holders

    dcp.save(state(full_a, full_b), os.path.join(root, "ckpt"))
    for attempt in range(2):
        sd = state(torch.zeros(8, 8), torch.zeros(6, 8, dtype=torch.int32))
        # The files are in the page cache all ranks share: broadcast anyway, to test it.
        r = dcp.load(sd, os.path.join(root, "ckpt"), broadcast_cached=True)
        assert torch.equal(sd["pairs"].full_tensor(), full_a)
        assert torch.equal(sd["all"].full_tensor(), full_b)
        assert r.broadcasts > 0, r
        # Groups of 2 are created once (by their members) and reused by the next load.
        assert r.groups_created == (1 if attempt == 0 else 0), (attempt, r.groups_created)

    # A broadcast buffer budget of one byte: every buffer goes alone, the data is the same.
    # Small replicated tensors are packed into buffers by the all-gathers over gloo (which
    # broadcasts, slab by slab): the peak held is reported, one 64-byte tensor at a time.
    small = {f"small.{i}": torch.full((16,), float(i)) for i in range(6)}
    dcp.save(small, os.path.join(root, "small"))
    got = {k: torch.zeros(16) for k in small}
    r = dcp.load(got, os.path.join(root, "small"), max_broadcast_buffer_bytes=1,
                 broadcast_cached=True)
    assert all(torch.equal(got[k], small[k]) for k in small)
    assert 0 < r.peak_broadcast_buffer_bytes <= 64, r
    sd = state(torch.zeros(8, 8), torch.zeros(6, 8, dtype=torch.int32))
    r = dcp.load(sd, os.path.join(root, "ckpt"), max_broadcast_buffer_bytes=1,
                 broadcast_cached=True)
    assert r.peak_broadcast_buffer_bytes <= 6 * 8 * 4, r  # the largest shard, alone
    assert torch.equal(sd["pairs"].full_tensor(), full_a)
    assert torch.equal(sd["all"].full_tensor(), full_b)
    try:
        dcp.load(sd, os.path.join(root, "ckpt"), max_broadcast_buffer_bytes=0)
        raise AssertionError("a zero broadcast buffer budget was accepted")
    except ValueError as e:
        assert "max_broadcast_buffer_bytes" in str(e), e

    # A process subgroup: ranks 1 and 3 save and load alone.
    sub = dist.new_group([1, 3])
    if rank in (1, 3):
        t = torch.full((4,), float(rank))
        # A value that differs per rank needs a name per rank (one name holds one value).
        dcp.save({"t": t, f"who.{rank}": rank}, os.path.join(root, "sub"), process_group=sub)
        sd = {"t": torch.zeros(4), f"who.{rank}": -1}
        dcp.load(sd, os.path.join(root, "sub"), process_group=sub)
        assert sd["t"].tolist() in ([1.0] * 4, [3.0] * 4) and sd[f"who.{rank}"] == rank, sd
        assert dcp.read_metadata(os.path.join(root, "sub")).world_size == 2
    dist.barrier()
    print(f"rank {rank}: ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
