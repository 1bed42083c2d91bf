"""The engine's communicator over a torch.distributed process group (or an mpi4py one).

An mpi4py communicator (`process_group=MPI.COMM_WORLD`, any Intracomm) uses the engine's MPI
backend over a duplicate of it: no torch.distributed needed, the same planner and format.

dcp never issues collectives on the caller's group: for each group it derives a gloo group of
its own over the group's store (any backend works, NCCL included, since dcp moves host
memory), and the engine's groups (CreateGroup: load's broadcast groups, the async saver's own
communicator) are further gloo groups built from the same store by their members alone —
torch's new_group would need every rank of the default group to take part.
"""

import ctypes
import sys
import time
from collections import Counter
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

from . import _dcp
from ._errors import invalid_argument

# A derived gloo group waits this long at most for its members to connect.
_CONNECT_TIMEOUT = timedelta(minutes=10)


class GlooGroup:
    """Byte-string collectives over a private ProcessGroupGloo (the `impl` of a PyComm).

    Ranks are this group's. Called by the engine under the GIL, one thread at a time.
    """

    def __init__(self, store: Any, prefix: str, rank: int, size: int):
        import torch.distributed as dist

        self._store, self._prefix, self._rank, self._size = store, prefix, rank, size
        self._pg = dist.ProcessGroupGloo(
            dist.PrefixStore(prefix + "/", store), rank, size, _CONNECT_TIMEOUT)
        self._created: Counter = Counter()

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _opts(cls_name: str, timeout_s: float, **fields: Any) -> Any:
        import torch._C._distributed_c10d as c10d

        opts = getattr(c10d, cls_name)()
        opts.timeout = timedelta(seconds=timeout_s)
        for k, v in fields.items():
            setattr(opts, k, v)
        return opts

    @staticmethod
    def _wait(work: Any, timeout_s: float) -> None:
        try:
            work.wait(timedelta(seconds=timeout_s))
        except Exception:
            # A timed-out operation is still queued in gloo's worker thread, which releases
            # its tensors (taking the GIL) when the operation ends -- after the same timeout.
            # Let it end while this interpreter is alive: a worker that needs the GIL during
            # interpreter shutdown aborts the process.
            deadline = time.monotonic() + timeout_s + 30
            while not work.is_completed() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise

    @staticmethod
    def _as_tensor(data: bytes, length: int) -> Any:
        import torch

        t = torch.zeros(length, dtype=torch.uint8)
        if data:
            t[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return t

    @staticmethod
    def _to_bytes(t: Any, n: int) -> bytes:
        return ctypes.string_at(t.data_ptr(), n) if n else b""

    def _all_sizes(self, n: int, timeout_s: float) -> List[int]:
        import torch

        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self._size)]
        work = self._pg.allgather([sizes], [torch.tensor([n], dtype=torch.int64)],
                                  self._opts("AllgatherOptions", timeout_s))
        self._wait(work, timeout_s)
        return [int(s.item()) for s in sizes]

    # -- the PyComm interface --------------------------------------------------------------
    def all_gather(self, data: bytes, timeout_s: float) -> List[bytes]:
        import torch

        sizes = self._all_sizes(len(data), timeout_s)
        longest = max(sizes)
        if longest == 0:
            return [b""] * self._size
        out = [torch.empty(longest, dtype=torch.uint8) for _ in range(self._size)]
        work = self._pg.allgather([out], [self._as_tensor(data, longest)],
                                  self._opts("AllgatherOptions", timeout_s))
        self._wait(work, timeout_s)
        return [self._to_bytes(t, n) for t, n in zip(out, sizes)]

    def gather(self, data: bytes, root: int, timeout_s: float) -> List[bytes]:
        import torch

        sizes = self._all_sizes(len(data), timeout_s)
        longest = max(sizes)
        if longest == 0:
            return [b""] * self._size if self._rank == root else []
        mine = root == self._rank
        out = [torch.empty(longest, dtype=torch.uint8) for _ in range(self._size)] if mine else []
        work = self._pg.gather([out] if mine else [], [self._as_tensor(data, longest)],
                               self._opts("GatherOptions", timeout_s, rootRank=root))
        self._wait(work, timeout_s)
        return [self._to_bytes(t, n) for t, n in zip(out, sizes)] if mine else []

    def broadcast(self, data: bytes, root: int, timeout_s: float) -> bytes:
        import torch

        size = torch.tensor([len(data)], dtype=torch.int64)
        self._wait(self._pg.broadcast(
            [size], self._opts("BroadcastOptions", timeout_s, rootRank=root)), timeout_s)
        n = int(size.item())
        if n == 0:
            return b""
        buf = self._as_tensor(data if self._rank == root else b"", n)
        self._wait(self._pg.broadcast(
            [buf], self._opts("BroadcastOptions", timeout_s, rootRank=root)), timeout_s)
        return self._to_bytes(buf, n)

    def broadcast_into(self, view: memoryview, root: int, timeout_s: float) -> None:
        import torch

        if len(view) == 0:  # the same size on every rank: all skip alike
            return
        buf = torch.frombuffer(view, dtype=torch.uint8)  # the engine's memory, no copy
        self._wait(self._pg.broadcast(
            [buf], self._opts("BroadcastOptions", timeout_s, rootRank=root)), timeout_s)

    def barrier(self, timeout_s: float) -> None:
        self._wait(self._pg.barrier(self._opts("BarrierOptions", timeout_s)), timeout_s)

    def create_group(self, ranks: List[int]) -> Tuple["GlooGroup", int, int]:
        # Members create a group in the same order (the Comm contract), so the n-th creation
        # of the same member list has the same name on each of them.
        key = ",".join(map(str, ranks))
        n = self._created[key]
        self._created[key] += 1
        group = GlooGroup(self._store, f"{self._prefix}/{key}#{n}", ranks.index(self._rank),
                          len(ranks))
        return group, group._rank, group._size


# The communicator derived from each process group, kept for the process's life: the
# engine caches broadcast groups and the async saver's communicator per communicator.
_DERIVED: Dict[int, Tuple[Any, Any]] = {}
_DERIVATIONS: Counter = Counter()


def _torch_dist() -> Optional[Any]:
    """torch.distributed when the job initialised it; dcp never imports torch itself."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _is_mpi4py_comm(obj: Any) -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(obj, mpi.Comm)


def _mpi_comm(comm: Any) -> Any:
    """The engine's MPI backend over (a duplicate of) an mpi4py communicator, one per comm."""
    cached = _DERIVED.get(id(comm))
    if cached is not None and cached[0] is comm:
        return cached[1]
    if not getattr(_dcp, "has_mpi", False):
        raise invalid_argument(
            "process_group is an mpi4py communicator but dcp was built without MPI")
    if comm == comm.__class__():  # MPI.COMM_NULL compares equal to an empty Comm
        raise invalid_argument("process_group is MPI.COMM_NULL")
    engine = _dcp.mpi_comm(comm.py2f())
    _DERIVED[id(comm)] = (comm, engine)
    return engine


def comm_for(process_group: Any, no_dist: bool) -> Any:
    """The engine communicator for a save or load call (every rank of the group calls)."""
    if no_dist:
        return _dcp.local_comm()
    if _is_mpi4py_comm(process_group):
        return _mpi_comm(process_group)
    dist = _torch_dist()
    if process_group is None:
        if dist is None:
            return _dcp.local_comm()
        process_group = dist.group.WORLD
    elif dist is None:
        raise invalid_argument("process_group given but torch.distributed is not initialized")
    cached = _DERIVED.get(id(process_group))
    if cached is not None and cached[0] is process_group:
        return cached[1]
    rank, size = dist.get_rank(process_group), dist.get_world_size(process_group)
    if rank < 0:
        raise invalid_argument("this process is not a member of process_group")
    if size == 1:
        comm = _dcp.local_comm()
    else:
        from torch.distributed.distributed_c10d import _get_process_group_store

        name = getattr(process_group, "group_name", "")
        prefix = f"dcp/{name}/{_DERIVATIONS[name]}"
        _DERIVATIONS[name] += 1
        comm = _dcp.python_comm(
            GlooGroup(_get_process_group_store(process_group), prefix, rank, size), rank, size)
    _DERIVED[id(process_group)] = (process_group, comm)
    return comm


def set_timeout(seconds: float, process_group: Any = None) -> None:
    """Bounds every collective dcp issues over `process_group` (default: the default group).

    A rank that does not arrive in time makes the others raise DcpError with code
    DEADLINE_EXCEEDED (default: 10 minutes); the communicator is then unusable. Groups the
    engine creates afterwards (broadcast groups, the async saver's) inherit the value.
    """
    comm_for(process_group, no_dist=False).timeout_seconds = seconds
