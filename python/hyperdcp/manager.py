"""hyperdcp.CheckpointManager: steps, `latest`, retention and resume over the C++ manager.

    mgr = dcp.CheckpointManager("/ckpt", keep_last=3, keep_every=1000)
    start = 0
    if mgr.latest_step() is not None:
        mgr.load(state_dict)
        start = mgr.latest_step() + 1
    for step in range(start, steps):
        train(step)
        if step % 100 == 0:
            mgr.async_save(step, state_dict)
    mgr.wait()

Same semantics as dcp::CheckpointManager (include/dcp/manager.h): one directory per step,
`latest` moved only after the step is durable on every rank, retention never removing the
newest complete step, resume from the newest complete step whatever `latest` says, one
manager per root, retired steps' data files recycled by the next save (`recycle_files`,
on by default; see docs/manager.md). Under torchrun every rank creates it (with the default process group unless
`process_group` is given) and calls its methods in the same order. Calls from several Python
threads take turns; the manager is closed at exit (a save in flight finishes first).
"""

import dataclasses
import os
from typing import Any, Dict, List, Optional, Union

from . import _boundary, _dcp
from ._comm import comm_for
from ._errors import DcpError
from ._optimizers import fill_empty_optimizers
from ._prepare import finish_load, prepare_on_every_rank, release


@dataclasses.dataclass
class MemoryTier:
    """The manager's memory tier (docs/memory-tier.md): recent steps in every host's memory
    and on `replicas` partner hosts, a step that is a multiple of `persist_every` also written
    to the root (0: only by persist() and at close), restored after a host is lost from what
    the others hold, onto any layout. `dir` is a tmpfs directory of every host; `max_bytes`
    bounds each host's tier (0: no bound; a step over it is saved to the root instead)."""

    dir: str = "/dev/shm/dcp-tier"
    replicas: int = 1
    keep_last: int = 2
    max_bytes: int = 0
    persist_every: int = 1
    persist_at_exit: bool = True
    replication_bytes_per_second: int = 0

    def _options(self) -> "_dcp.MemoryTierOptions":
        o = _dcp.MemoryTierOptions()
        for f in dataclasses.fields(self):
            setattr(o, f.name, getattr(self, f.name))
        return o


def _tier_options(memory_tier: "Union[MemoryTier, Dict[str, Any], bool, None]"
                  ) -> "Optional[_dcp.MemoryTierOptions]":
    if memory_tier is None or memory_tier is False:
        return None
    if memory_tier is True:
        return MemoryTier()._options()
    if isinstance(memory_tier, dict):
        return MemoryTier(**memory_tier)._options()
    if isinstance(memory_tier, MemoryTier):
        return memory_tier._options()
    raise TypeError("memory_tier must be a hyperdcp.MemoryTier, a dict of its fields, True or "
                    f"None, not {type(memory_tier).__name__}")


class CheckpointManager:
    """A root directory of checkpoints, one per training step."""

    def __init__(self, root: "os.PathLike | str", *, keep_last: Optional[int] = None,
                 keep_every: Optional[int] = None, process_group: Any = None,
                 no_dist: bool = False, recycle_files: bool = True,
                 allow_partial: bool = False, verify_checksums: bool = True,
                 max_open_files: int = 8, max_staging_bytes: int = 0,
                 staging_threads: int = 0, persist_nice: int = 10,
                 allow_pickle: bool = False,
                 memory_tier: "Union[MemoryTier, Dict[str, Any], bool, None]" = None,
                 lock_lease_seconds: float = 300.0, break_lock: bool = False,
                 incremental: bool = False, full_every: int = 10) -> None:
        """`allow_partial`, `verify_checksums`, `max_open_files`: as load's, for every load of
        the manager; `max_staging_bytes`, `staging_threads`, `persist_nice`: its async
        saver's (docs/manager.md, "File recycling"); `allow_pickle`: as save's and load's; `memory_tier`: a
        MemoryTier (or a dict of its fields, or True for the defaults) to keep recent steps in
        the hosts' memory; `lock_lease_seconds`: a job on another host holding the root
        that has not renewed its lock for this long is gone, and its lock is broken with a
        warning; `break_lock`: take the root's lock from a holder not alive on this host
        (`dcp unlock ROOT` by hand); `incremental`: each save writes only the tensor chunks
        that changed since the newest complete step and references that step for the rest
        (retention keeps such bases while kept steps need them); `full_every`: every
        full_every-th save is a full one (docs/incremental.md)."""
        if not lock_lease_seconds > 0:
            raise ValueError(f"lock_lease_seconds must be positive, not {lock_lease_seconds!r}")
        tier = _tier_options(memory_tier)
        self._comm = comm_for(process_group, no_dist)
        self._root = os.fspath(root)
        self._allow_pickle = allow_pickle
        self._mgr = _boundary.call(
            self._comm, _dcp.CheckpointManager, self._root, keep_last, keep_every, self._comm,
            recycle_files, allow_partial, verify_checksums, max_open_files, max_staging_bytes,
            staging_threads, persist_nice, tier, float(lock_lease_seconds), bool(break_lock),
            bool(incremental), int(full_every))
        _boundary.register_closable(self)

    def _call(self, fn: Any, *args: Any) -> Any:
        return _boundary.call(self._comm, fn, *args)

    def _prepare(self, state_dict: Dict[str, Any], for_load: bool = False) -> Any:
        return prepare_on_every_rank(state_dict, self._comm, for_load=for_load, agree=True,
                                     allow_pickle=self._allow_pickle)

    @property
    def root(self) -> str:
        return self._root

    def save(self, step: int, state_dict: Dict[str, Any]) -> _dcp.SaveResult:
        """Saves `state_dict` as `step`, then moves `latest` and applies retention."""
        p = self._prepare(state_dict)  # alive until the engine returns: it owns host copies
        try:
            return self._call(self._mgr.save, step, p.sd)
        finally:
            release(p)

    def async_save(self, step: int, state_dict: Dict[str, Any]) -> None:
        """Finishes the save in flight, then returns once `state_dict` is staged.

        The tensors may change as soon as it returns. The save is finished (latest moved,
        retention applied, its error raised) by the next save, async_save, wait or load.
        """
        p = self._prepare(state_dict)
        try:
            self._call(self._mgr.async_save, step, p.sd)
        finally:
            release(p)

    def prepare_async_save(self, state_dict: Dict[str, Any]) -> None:
        """Optional, before the first async_save: allocates the staging memory ahead of time,
        so the first async_save blocks only while it copies (see dcp.prepare_async_save)."""
        p = self._prepare(state_dict)
        try:
            self._call(self._mgr.prepare_async_save, p.sd)
        finally:
            release(p)

    def wait(self) -> None:
        """Finishes the save in flight; raises its DcpError."""
        self._call(self._mgr.wait)

    def latest_step(self) -> Optional[int]:
        """The newest complete step (in the root or the hosts' memory), or None before the
        first one."""
        with _boundary.serial():
            return self._mgr.latest_step()

    def steps(self) -> List[int]:
        """The complete steps on disk (in the root), ascending."""
        with _boundary.serial():
            return self._mgr.steps()

    def memory_steps(self) -> List[int]:
        """With a memory tier: the steps the hosts' memory can restore, ascending."""
        with _boundary.serial():
            return self._mgr.memory_steps()

    def persist(self) -> None:
        """With a memory tier: writes the newest step saved to memory into the root, if the
        root lacks it (close() does it too unless persist_at_exit is off)."""
        self._call(self._mgr.persist)

    def load(self, state_dict: Dict[str, Any], step: Optional[int] = None) -> _dcp.LoadResult:
        """Loads `step` (default: the newest complete one) into `state_dict`, in place.

        As `load`: Stateful objects get load_state_dict(), and a freshly built optimizer's
        state is created first when the step holds state for it."""
        target = self.latest_step() if step is None else step
        if target is not None:
            try:
                fill_empty_optimizers(state_dict, self.step_dir(target))
            except DcpError:  # a step the root lacks (in the memory tier only): as torch does
                pass
        p = self._prepare(state_dict, for_load=True)
        try:
            result = self._call(self._mgr.load, p.sd, step)
            finish_load(p, self._allow_pickle)
        finally:
            release(p)
        return result

    def keep(self, step: int) -> None:
        """Never remove `step` while this manager lives ("keep this one")."""
        with _boundary.serial():
            self._mgr.keep(step)

    def prune(self, dry_run: bool = False) -> List[int]:
        """Applies the retention policy now; the steps removed (or that would be)."""
        return self._call(self._mgr.prune, dry_run)

    def step_dir(self, step: int) -> str:
        with _boundary.serial():
            return self._mgr.step_dir(step)

    def close(self) -> None:
        """Finishes the save in flight and releases the root's lock."""
        self._call(self._mgr.close)

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def unlock(path: "os.PathLike | str") -> List[str]:
    """Removes the lock of a manager's root or of a checkpoint directory whose job is gone
    (`dcp unlock`); refused for a holder alive on this host. One line per lock removed."""
    return _dcp.unlock(os.fspath(path))
