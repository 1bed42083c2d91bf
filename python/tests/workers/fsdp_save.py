"""2 ranks: train a model under FSDP2 with AdamW, save it with dcp (and the unsharded state
for comparison, DIR/ref.pt); load it back into a fresh FSDP2 model and compare.

Args: DIR
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import hyperdcp as dcp
import model as m


def sharded_model():
    net = m.make_model()
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    return net, m.make_optimizer(net)


def main() -> None:
    root = sys.argv[1]
    dist.init_process_group("gloo")
    net, optim = sharded_model()
    m.train(net, optim, steps=3)
    dcp.save(m.state(net, optim), os.path.join(root, "ckpt"))
    ref = m.full_state(net, optim)
    if dist.get_rank() == 0:
        torch.save(ref, os.path.join(root, "ref.pt"))

    # Resume in the same layout: a fresh model, trained differently, then loaded.
    net2, optim2 = sharded_model()
    m.train(net2, optim2, steps=1)
    sd = m.state(net2, optim2)
    dcp.load(sd, os.path.join(root, "ckpt"))
    m.restore(net2, optim2, sd)
    got = m.full_state(net2, optim2)
    m.assert_equal(got, ref)
    dist.barrier()
    print(f"rank {dist.get_rank()}: ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
