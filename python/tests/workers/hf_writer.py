"""torch's HuggingFaceStorageWriter/Reader served by hyperdcp, next to torch's own: the same
state saved by both (2 ranks, FSDP-style row shards, a replicated bf16 norm, a non-ASCII
name), each read back by the other's reader into another layout and dtype."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import hyperdcp
from hyperdcp import _delegate

dist.init_process_group("gloo")
rank = dist.get_rank()
out = sys.argv[1]
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
full = {"model.embed.weight": torch.randn(10, 6), "model.norm.weight": torch.randn(6).bfloat16(),
        "lm_head.weight": torch.randn(7, 6), "bias.\u00e9": torch.randn(3),
        "model.proj.weight": torch.randn(5, 9)}
mapping = {"model.embed.weight": 1, "model.norm.weight": 1, "bias.\u00e9": 2, "lm_head.weight": 2,
           "model.proj.weight": 1}


def sharded():
    placement = {"model.proj.weight": [Shard(1)]}  # columns: not contiguous in the whole
    return {k: distribute_tensor(v, mesh, placement.get(
        k, [Shard(0)] if v.dim() == 2 else [Replicate()])) for k, v in full.items()}


def writer(name, **kw):
    return HuggingFaceStorageWriter(os.path.join(out, name), fqn_to_index_mapping=mapping,
                                    save_distributed=True, enable_consolidation=True, **kw)


_delegate.torch_function("save")(sharded(), storage_writer=writer("torch"))
r = hyperdcp.save(sharded(), storage_writer=writer("hyper"))
# Replicated plain tensors, no mapping: torch's dedup decides who writes each, and its
# metadata order (what each rank writes, rank by rank) orders the consolidated file.
plain = {name: torch.full((4 + i,), float(i)) for i, name in enumerate("abcd")}
for name, save in (("torch-replicated", _delegate.torch_function("save")),
                   ("hyper-replicated", hyperdcp.save)):
    save(dict(plain), storage_writer=HuggingFaceStorageWriter(
        os.path.join(out, name), save_distributed=True, enable_consolidation=True))
assert r.files_written > 0 and r.total_bytes == sum(v.nbytes for v in full.values()), r
dist.barrier()


def check(loaded, name):
    for k, v in full.items():
        got = loaded[k].full_tensor() if hasattr(loaded[k], "full_tensor") else loaded[k]
        assert torch.equal(got.to(v.dtype), v), (name, k)


# Each reader on each writer's files, consolidated and sharded, into replicated float32.
for load_name, load in (("hyperdcp", hyperdcp.load), ("torch", _delegate.torch_function("load"))):
    for src in ("torch", "torch/sharded", "hyper", "hyper/sharded"):
        tgt = {k: distribute_tensor(torch.zeros(v.shape), mesh, [Replicate()])
               for k, v in full.items()}
        load(tgt, storage_reader=HuggingFaceStorageReader(os.path.join(out, src)))
        check(tgt, f"{load_name} <- {src}")

# Under install(), torch's own entry points serve the writer; a full state dict of one
# process (torch's default save_distributed=False) writes model-*-of-* and an index.
hyperdcp.install()
import torch.distributed.checkpoint as dcp  # noqa: E402

if rank == 0:
    dcp.save(dict(full), storage_writer=HuggingFaceStorageWriter(os.path.join(out, "one")),
             no_dist=True)
    back = {k: torch.zeros_like(v) for k, v in full.items()}
    _delegate.torch_function("load")(back, storage_reader=HuggingFaceStorageReader(
        os.path.join(out, "one")), no_dist=True)
    check(back, "one")
dist.barrier()
print(f"rank {rank}: ok", flush=True)
dist.destroy_process_group()
