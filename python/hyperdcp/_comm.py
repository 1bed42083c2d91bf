"""The engine's communicator for a call: a world of one, a torch.distributed process group
(through private gloo groups, see _gloo.py), or an mpi4py communicator.

An mpi4py communicator (`process_group=MPI.COMM_WORLD`, any Intracomm) uses the engine's MPI
backend over a duplicate of it: no torch.distributed needed, the same planner and format. The
backend is a plugin (_dcp_mpi.so) loaded only then, so hyperdcp imports without Open MPI.
"""

import math
import os
import sys
from collections import Counter
from typing import Any, Dict, Optional, Tuple

from . import _dcp
from ._errors import invalid_argument
from ._gloo import GlooGroup, Job

_DEFAULT_TIMEOUT_S = 600.0
_FOREVER_S = 365 * 24 * 3600.0  # what None and inf mean: no deadline a job would reach

# The communicator derived from each process group, kept for the process's life (the engine
# caches broadcast groups and the async saver's communicator per communicator), with its Job
# (None for MPI and a world of one).
_DERIVED: Dict[int, Tuple[Any, Any, Optional[Job]]] = {}
_JOBS: Dict[int, Job] = {}  # id(engine comm) -> Job
_DERIVATIONS: Counter = Counter()
_TIMEOUTS: Dict[Any, float] = {}  # id(process group) or None (every group) -> seconds


def timeout_seconds(value: Optional[float]) -> float:
    """A timeout given by a caller: None and inf wait (practically) forever."""
    if value is None or (isinstance(value, float) and math.isinf(value) and value > 0):
        return _FOREVER_S
    value = float(value)
    if not value > 0:  # also catches nan
        raise invalid_argument(f"timeout must be positive, None or inf, not {value}")
    return min(value, _FOREVER_S)


def _torch_dist() -> Optional[Any]:
    """torch.distributed when the job initialised it; hyperdcp never imports torch itself."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _is_mpi4py_comm(obj: Any) -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(obj, mpi.Comm)


def mpi_plugin_path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_dcp_mpi.so")


def _mpi_comm(comm: Any) -> Any:
    """The engine's MPI backend over (a duplicate of) an mpi4py communicator, one per comm."""
    cached = _DERIVED.get(id(comm))
    if cached is not None and cached[0] is comm:
        return cached[1]
    if not os.path.exists(mpi_plugin_path()):
        raise invalid_argument(
            "process_group is an mpi4py communicator but hyperdcp was built without its MPI "
            f"backend ({mpi_plugin_path()} is missing: build with Open MPI installed)")
    if comm == comm.__class__():  # MPI.COMM_NULL compares equal to an empty Comm
        raise invalid_argument("process_group is MPI.COMM_NULL")
    engine = _dcp.mpi_comm(comm.py2f(), mpi_plugin_path())
    engine.timeout_seconds = _TIMEOUTS.get(id(comm), _TIMEOUTS.get(None, _DEFAULT_TIMEOUT_S))
    _DERIVED[id(comm)] = (comm, engine, None)
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
        if cached[2] is not None:
            cached[2].check()
        return cached[1]
    rank, size = dist.get_rank(process_group), dist.get_world_size(process_group)
    if rank < 0:
        raise invalid_argument("this process is not a member of process_group")
    timeout = _TIMEOUTS.get(id(process_group), _TIMEOUTS.get(None, _DEFAULT_TIMEOUT_S))
    job = None
    if size == 1:
        comm = _dcp.local_comm()
    else:
        from torch.distributed.distributed_c10d import _get_process_group_store

        name = getattr(process_group, "group_name", "")
        prefix = f"hyperdcp/{name}/{_DERIVATIONS[name]}"
        _DERIVATIONS[name] += 1
        job = Job(_get_process_group_store(process_group), prefix, rank, size, timeout)
        comm = _dcp.python_comm(GlooGroup(job, prefix, range(size)), rank, size)
        _JOBS[id(comm)] = job
    comm.timeout_seconds = timeout
    _DERIVED[id(process_group)] = (process_group, comm, job)
    return comm


def close_groups() -> None:
    """Closes every gloo group hyperdcp created (at exit, once its saves have finished)."""
    for job in list(_JOBS.values()):
        for group in list(job._groups):
            group.close()


def job_of(comm: Any) -> Optional[Job]:
    """The Job of a communicator derived from a torch process group; None otherwise."""
    return _JOBS.get(id(comm))


def set_timeout(seconds: Optional[float], process_group: Any = None) -> None:
    """Bounds every collective hyperdcp issues over `process_group` (default: every group
    without a timeout of its own), and the connect of the groups it derives from it.

    Local to this rank, no collective: call it on every rank that should use the value. A rank
    that does not arrive in time makes the others raise DcpError with code DEADLINE_EXCEEDED
    naming it (default: 10 minutes); the communicator is then unusable. None or inf: no
    deadline.
    """
    s = timeout_seconds(seconds)
    key = None if process_group is None else id(process_group)
    _TIMEOUTS[key] = s
    for pg, comm, job in list(_DERIVED.values()):
        if key is None or pg is process_group:
            if key is None and id(pg) in _TIMEOUTS and id(pg) != key:
                continue  # a group with a timeout of its own keeps it
            comm.timeout_seconds = s
            if job is not None:
                job.timeout_s = s
