"""The byte-string collectives of hyperdcp's gloo groups with every size class on every rank
at once: empty, small (one round: the bytes ride with the length), exactly the inline size,
one byte over, and large (a second round), each rank's different, checked everywhere."""

import sys

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_process_group_store

from hyperdcp._gloo import GlooGroup, Job, inline_bytes


def message(rank: int, size: int) -> bytes:
    return bytes((rank * 31 + i) % 251 for i in range(size))


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    job = Job(_get_process_group_store(dist.group.WORLD), "test/gloo", rank, world, 120.0)
    group = GlooGroup(job, "test/gloo", range(world))
    inline = inline_bytes(world)
    sizes = [0, 10, inline, inline + 1, 3 * inline + 17]
    for round_ in range(len(sizes)):
        mine = [sizes[(round_ + r) % len(sizes)] for r in range(world)]
        want = [message(r, mine[r]) for r in range(world)]
        assert group.all_gather(want[rank], 60.0) == want, ("all_gather", mine)
        for root in range(world):
            got = group.gather(want[rank], root, 60.0)
            assert got == (want if rank == root else []), ("gather", root, mine)
            got = group.broadcast(want[rank] if rank == root else b"", root, 60.0)
            assert got == want[root], ("broadcast", root, mine)
    print(f"rank {rank}: collectives ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
