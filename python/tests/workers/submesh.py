"""A DTensor on a sub-mesh that some ranks are not part of (torch's
test_distributed_tensor_planner): saved by the ranks of its mesh, loaded back into the same
layout and whole by one process; the other ranks' state saves and loads around it."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor

import hyperdcp as dcp

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = sys.argv[1]
full = torch.arange(24.0).reshape(6, 4)
sub = DeviceMesh("cpu", [0])  # rank 0 alone
whole = DeviceMesh("cpu", list(range(world)))
state = {"submesh_sdt": distribute_tensor(full, sub, [Shard(0)]),
         "sdt": distribute_tensor(full * 2, whole, [Shard(0)]),
         "rdt": distribute_tensor(full * 3, whole, [Replicate()]),
         "step": 5}
dcp.save(state, os.path.join(out, "ck"))
back = {"submesh_sdt": distribute_tensor(torch.zeros(6, 4), sub, [Shard(0)]),
        "sdt": distribute_tensor(torch.zeros(6, 4), whole, [Shard(0)]),
        "rdt": distribute_tensor(torch.zeros(6, 4), whole, [Replicate()]),
        "step": 0}
dcp.load(back, os.path.join(out, "ck"))
assert back["step"] == 5
assert torch.equal(back["sdt"].full_tensor(), full * 2)
assert torch.equal(back["rdt"].to_local(), full * 3)
if rank == 0:
    assert torch.equal(back["submesh_sdt"].to_local(), full)
dist.barrier()
print(f"rank {rank}: ok", flush=True)
dist.destroy_process_group()
