"""torch's HuggingFace storage classes under hyperdcp.install(), against torch's own, on 4 ranks:
a tensor saved from every 2-d placement (row and column shards, replicas) by either library is
loaded by either into every 2-d and 1-d placement; a one-element tensor sharded over 4 ranks
(three empty shards) the same way."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor, zeros

import hyperdcp
from hyperdcp._delegate import torch_function

hyperdcp.install()
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import HuggingFaceStorageReader as Reader  # noqa: E402
from torch.distributed.checkpoint import HuggingFaceStorageWriter as Writer  # noqa: E402

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = sys.argv[1]
mesh2 = init_device_mesh("cpu", (2, world // 2))
mesh1 = init_device_mesh("cpu", (world,))
whole = torch.arange(16, dtype=torch.float).view(4, 4)
PLACEMENTS_2D = [[Replicate(), Replicate()], [Replicate(), Shard(0)], [Shard(0), Replicate()],
                 [Shard(0), Shard(0)], [Shard(1), Shard(0)]]
LIBRARIES = {"hyperdcp": (dcp.save, dcp.load),
             "torch": (torch_function("save"), torch_function("load"))}

n = 0
for saver, (save, _) in LIBRARIES.items():
    for placements in PLACEMENTS_2D:
        path = os.path.join(out, f"c{n}")
        n += 1
        save({"t": distribute_tensor(whole, mesh2, placements)},
             storage_writer=Writer(path, save_distributed=True))
        for loader, (_, load) in LIBRARIES.items():
            for target in PLACEMENTS_2D + [[Shard(0)], [Replicate()]]:
                sd = {"t": zeros([4, 4], device_mesh=mesh2 if len(target) == 2 else mesh1,
                                 placements=target)}
                load(sd, storage_reader=Reader(path))
                assert torch.equal(sd["t"].full_tensor(), whole), \
                    (saver, placements, loader, target)

one = torch.rand(1)
dist.broadcast(one, 0)
for saver, (save, _) in LIBRARIES.items():
    path = os.path.join(out, f"e{n}")
    n += 1
    save({"x": distribute_tensor(one, mesh1, [Shard(0)])},
         storage_writer=Writer(path, save_distributed=True))
    for loader, (_, load) in LIBRARIES.items():
        sd = {"x": distribute_tensor(torch.zeros(1), mesh2, [Shard(0), Shard(0)])}
        load(sd, storage_reader=Reader(path))
        assert torch.equal(sd["x"].full_tensor(), one), (saver, loader)
dist.barrier()
print(f"rank {rank}: ok", flush=True)
dist.destroy_process_group()
