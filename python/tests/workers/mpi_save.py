"""Under mpirun (no torch.distributed): save with process_group=MPI.COMM_WORLD on the engine's
MPI backend, reshard-load, async save whose source changes at once. Args: DIR."""

import sys

import numpy as np
from mpi4py import MPI

import hyperdcp as dcp
from hyperdcp._comm import comm_for

G = (8, 6)


def full(salt: float) -> np.ndarray:
    return np.arange(48, dtype=np.float32).reshape(G) + salt


def state(salt: float, rank: int, size: int) -> dict:
    rows = G[0] // size
    return {
        "w": dcp.TensorChunk(full(salt)[rank * rows:(rank + 1) * rows].copy(), G, (rank * rows, 0)),
        "rep": dcp.TensorChunk(full(salt) * 2, G, (0, 0)),  # replicated on every rank
        "step": 7 + int(salt),
    }


def check(path: str, salt: float, comm, rank: int, size: int) -> None:
    cols = G[1] // size
    target = {"w": dcp.TensorChunk(np.zeros((G[0], cols), np.float32), G, (0, rank * cols)),
              "rep": dcp.TensorChunk(np.zeros((4, G[1]), np.float32), G, (4, 0)), "step": 0}
    dcp.load(target, path, process_group=comm)
    assert np.array_equal(target["w"].data, full(salt)[:, rank * cols:(rank + 1) * cols]), path
    assert np.array_equal(target["rep"].data, full(salt)[4:] * 2), path
    assert target["step"] == 7 + int(salt), target["step"]


def main() -> None:
    root = sys.argv[1]
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    engine = comm_for(comm, no_dist=False)
    assert engine.backend == "mpi" and engine.size == size and engine.rank == rank, engine.backend
    assert comm_for(comm, no_dist=False) is engine  # one engine communicator per mpi4py comm

    r = dcp.save(state(0, rank, size), root + "/sync", process_group=comm)
    # The replicated tensor is written once in all (dedup over the MPI backend): the two
    # tensors' bytes plus the step's few JSON bytes, not a copy of "rep" per rank.
    total = comm.allreduce(r.bytes_written)
    assert r.unique_bytes == 2 * 48 * 4 and total - r.unique_bytes < 8, (total, r.unique_bytes)
    check(root + "/sync", 0, comm, rank, size)

    src = state(1, rank, size)
    h = dcp.async_save(src, root + "/async", process_group=comm)
    src["w"].data.fill(-1)  # the save was staged: this must not reach the checkpoint
    src["rep"].data.fill(-1)
    h.result(timeout=120)
    check(root + "/async", 1, comm, rank, size)

    # A failure on one rank reaches every rank (over MPI) instead of hanging them.
    bad = state(0, rank, size)
    if rank == 1:
        bad["w"] = dcp.TensorChunk(np.zeros((1, 1), np.float32), G, (99, 0))
    try:
        dcp.save(bad, root + "/bad", process_group=comm)
    except dcp.DcpError as e:
        assert "rank 1" in str(e), e
    else:
        raise AssertionError("a bad chunk on rank 1 did not fail the save")
    print(f"{rank}: ok", flush=True)


if __name__ == "__main__":
    main()
