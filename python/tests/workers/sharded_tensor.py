"""2 ranks: a ShardedTensor (FSDP1's SHARDED_STATE_DICT form, rows split between the ranks)
saved with hyperdcp; loaded back into ShardedTensors split by columns, and (by the test) into
a plain tensor in one process. Args: DIR."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

import hyperdcp as dcp

FULL = torch.arange(48, dtype=torch.float32).reshape(6, 8)


def sharded(rows: bool, fill: bool):
    rank = dist.get_rank()
    offsets = [3 * rank, 0] if rows else [0, 4 * rank]
    sizes = [3, 8] if rows else [6, 4]
    part = FULL[offsets[0]:offsets[0] + sizes[0], offsets[1]:offsets[1] + sizes[1]]
    local = part.clone() if fill else torch.zeros(sizes)
    md = ShardMetadata(shard_offsets=offsets, shard_sizes=sizes, placement=f"rank:{rank}/cpu")
    return init_from_local_shards([Shard(local, md)], 6, 8)


FULL8 = torch.arange(32, dtype=torch.float32).reshape(8, 4)


def interleaved(fill: bool):
    """Two local shards of two rows each on every rank, not adjacent."""
    rank = dist.get_rank()
    shards = []
    for first in (2 * rank, 2 * rank + 4):
        local = FULL8[first:first + 2].clone() if fill else torch.zeros(2, 4)
        md = ShardMetadata(shard_offsets=[first, 0], shard_sizes=[2, 4],
                           placement=f"rank:{rank}/cpu")
        shards.append(Shard(local, md))
    return init_from_local_shards(shards, 8, 4)


def main() -> None:
    root = sys.argv[1]
    dist.init_process_group("gloo")
    dcp.save({"w": sharded(rows=True, fill=True), "step": 4}, os.path.join(root, "st"))
    back = {"w": sharded(rows=False, fill=False), "step": 0}
    dcp.load(back, os.path.join(root, "st"))
    shard = back["w"].local_shards()[0]
    o = shard.metadata.shard_offsets
    assert torch.equal(shard.tensor, FULL[:, o[1]:o[1] + 4]) and back["step"] == 4
    # Several local shards on a rank (FSDP1-style state resharded by torch's tests): rows
    # 0-1 and 4-5 on rank 0, rows 2-3 and 6-7 on rank 1; loaded back into the same form.
    dcp.save({"w": interleaved(fill=True)}, os.path.join(root, "two"))
    back2 = {"w": interleaved(fill=False)}
    dcp.load(back2, os.path.join(root, "two"))
    for shard in back2["w"].local_shards():
        r = shard.metadata.shard_offsets[0]
        assert torch.equal(shard.tensor, FULL8[r:r + 2]), (r, shard.tensor)
    assert torch.equal(dcp.load_all(os.path.join(root, "two"))["w"], FULL8)
    # Opened without a template on every rank: each gets the whole tensor and the value.
    opened = dcp.load_all(os.path.join(root, "st"))
    assert torch.equal(opened["w"], FULL) and opened["step"] == 4
    print(f"rank {dist.get_rank()}: ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
