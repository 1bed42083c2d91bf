"""One rank's failure reaches every rank as a DcpError naming that rank, never a hang.

Args: DIR
"""

import os
import sys

import torch
import torch.distributed as dist

import hyperdcp as dcp


def expect_error(what: str, fn, needle: str) -> None:
    try:
        fn()
    except dcp.DcpError as e:
        assert needle in str(e), f"{what}: {e}"
        return
    raise AssertionError(f"{what}: no DcpError on rank {dist.get_rank()}")


def main() -> None:
    root = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    good = os.path.join(root, "good")
    dcp.save({"w": torch.full((4,), float(rank)), "step": 1}, good)

    # Found in Python before any I/O (an unsupported value on rank 2 only).
    sd = {"w": torch.zeros(4), "step": object() if rank == 2 else 1}
    expect_error("bad value", lambda: dcp.save(sd, os.path.join(root, "bad")), "rank 2: ")
    assert not os.path.exists(os.path.join(root, "bad", "dcp.metadata"))

    # Found by the engine: rank 1 asks for a tensor of another shape.
    sd = {"w": torch.zeros(5 if rank == 1 else 4), "step": 0}
    expect_error("bad shape", lambda: dcp.load(sd, good), "rank 1: ")

    # Ranks that disagree on a tensor's dtype while saving.
    sd = {"w": torch.zeros(4, dtype=torch.float64 if rank == 3 else torch.float32)}
    expect_error("dtype mismatch", lambda: dcp.save(sd, os.path.join(root, "mixed")), "'w'")

    # The group still works after errors.
    sd = {"w": torch.zeros(4), "step": 0}
    dcp.load(sd, good)
    assert sd["step"] == 1

    # A rank that never arrives (3): the others time out instead of hanging. A group of
    # its own, since a communicator that timed out is not usable any more.
    group = dist.new_group(list(range(dist.get_world_size())))
    dcp.set_timeout(2.0, process_group=group)
    if rank != 3:
        try:
            dcp.save(sd, os.path.join(root, "late"), process_group=group)
        except dcp.DcpError as e:
            assert e.code == "DEADLINE_EXCEEDED", (e.code, str(e))
        else:
            raise AssertionError("no timeout")
    dist.barrier()
    print(f"rank {rank}: ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
