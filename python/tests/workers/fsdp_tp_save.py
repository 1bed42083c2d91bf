"""4 ranks: the model under TP (2) x FSDP2 (2) on a 2x2 CPU mesh (placements include
_StridedShard), trained with AdamW and saved with dcp, plus the unsharded state (DIR/ref.pt).

Args: DIR
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

import hyperdcp as dcp
import model as m


def main() -> None:
    root = sys.argv[1]
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    net = m.make_model()
    parallelize_module(net, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(net, mesh=mesh["dp"])
    optim = m.make_optimizer(net)
    m.train(net, optim, steps=2)
    sd = m.state(net, optim)
    kinds = {type(p).__name__ for t in sd["model"].values() for p in t.placements}
    assert "_StridedShard" in kinds, kinds
    dcp.save(sd, os.path.join(root, "ckpt"))
    ref = m.full_state(net, optim)
    if dist.get_rank() == 0:
        torch.save(ref, os.path.join(root, "ref.pt"))
    dist.barrier()
    print(f"rank {dist.get_rank()}: ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
