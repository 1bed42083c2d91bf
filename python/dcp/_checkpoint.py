"""save / async_save / load: state dict -> engine StateDict -> the C++ engine, and back."""

import atexit
import os
from typing import Any, Dict, List, Optional, Tuple

from . import _dcp, _values
from ._chunks import HostChunk, host_chunk, is_tensor
from ._comm import comm_for
from ._errors import DcpError
from ._flatten import flatten, replace_leaves


class _Prepared:
    """An engine StateDict over the caller's state, and what must outlive the engine call."""

    def __init__(self) -> None:
        self.sd = _dcp.StateDict()
        self.chunks: List[HostChunk] = []
        self.values: List[str] = []  # fqns of non-tensor entries


def _prepare(state_dict: Any, for_load: bool) -> _Prepared:
    p = _Prepared()
    for fqn, leaf in flatten(state_dict, is_tensor).items():
        if is_tensor(leaf):
            chunk = host_chunk(fqn, leaf, for_load)
            if chunk is None:
                continue
            p.sd.add_tensor(fqn, chunk.data_ptr, chunk.dtype, chunk.shape,
                            chunk.global_shape, chunk.offsets)
            p.chunks.append(chunk)
        else:
            p.sd.add_bytes(fqn, b"" if for_load else _values.encode(fqn, leaf))
            p.values.append(fqn)
    return p


def _prepare_on_every_rank(state_dict: Any, comm: Any, for_load: bool,
                           agree: bool) -> _Prepared:
    """_prepare, with a failure on any rank raised on every rank (none then enters the engine)."""
    error: Optional[BaseException] = None
    prepared = None
    try:
        prepared = _prepare(state_dict, for_load)
    except Exception as e:  # any rank's failure must reach every rank, not hang them
        error = e
    if agree and comm.size > 1:
        message = None if error is None else (
            str(error) if isinstance(error, DcpError) else f"{type(error).__name__}: {error}")
        _dcp.agree_on_status(comm, message)
    if error is not None:
        raise error
    return prepared


def save(state_dict: Dict[str, Any], checkpoint_id: "os.PathLike | str", *,
         process_group: Any = None, no_dist: bool = False,
         use_collectives: bool = True, step: int = 0) -> _dcp.SaveResult:
    """Saves `state_dict` into the directory `checkpoint_id`; every rank of the group calls it.

    Tensors are written from their own memory (CPU) or one host copy (device memory,
    non-contiguous); non-tensor values are stored as JSON. Returns this rank's SaveResult.
    `step`: without collectives, the save's identity, the same on every rank and greater than
    the previous save's into this directory (a load takes the newest step every rank saved).
    """
    comm = comm_for(process_group, no_dist)
    p = _prepare_on_every_rank(state_dict, comm, for_load=False, agree=use_collectives)
    return _dcp.save(p.sd, os.fspath(checkpoint_id), comm, use_collectives, step)


class AsyncSaveHandle:
    """An asynchronous save in progress; see `async_save`."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def done(self) -> bool:
        """True once the save finished, successfully or not. Never blocks."""
        return self._handle.done()

    def result(self, timeout: Optional[float] = None) -> _dcp.SaveResult:
        """Waits for the save; its SaveResult, or raises its DcpError (on every rank).

        Raises TimeoutError if it has not finished within `timeout` seconds.
        """
        if not self._handle.wait(timeout):
            raise TimeoutError(f"save to {self._handle.dir} still running after {timeout} s")
        return self._handle.get()

    @property
    def staging(self) -> _dcp.StagingStats:
        """What staging copied and how long the caller was blocked."""
        return self._handle.staging


_saver: Optional[Any] = None


def _process_saver() -> Any:
    global _saver
    if _saver is None:
        _saver = _dcp.AsyncSaver()
        # Pending saves finish before the interpreter goes away (their thread needs it).
        atexit.register(_saver.close)
    return _saver


def async_save(state_dict: Dict[str, Any], checkpoint_id: "os.PathLike | str", *,
               process_group: Any = None, no_dist: bool = False,
               use_collectives: bool = True, step: int = 0) -> AsyncSaveHandle:
    """Like `save`, but returns once the state is copied to host staging memory.

    The tensors may be changed as soon as it returns. Planning, writing and the commit run
    on a background thread with a communicator of its own (never the caller's group). Saves
    persist one at a time, in call order.
    """
    comm = comm_for(process_group, no_dist)
    p = _prepare_on_every_rank(state_dict, comm, for_load=False, agree=use_collectives)
    return AsyncSaveHandle(
        _process_saver().save(p.sd, os.fspath(checkpoint_id), comm, use_collectives, step))


def prepare_async_save(state_dict: Dict[str, Any], *, process_group: Any = None,
                       no_dist: bool = False) -> None:
    """Gets `async_save` ready for `state_dict` ahead of its first call; every rank calls it.

    Allocates and pre-faults the host staging memory the state dict needs (kept for the
    saves that follow) and creates the saver's own communicator, so that the first
    `async_save` blocks only while it copies, like later ones, instead of several times
    longer. Optional: call it once, after building the model and optimizer, before training.
    A save needing more memory than was prepared still works (it allocates).
    """
    comm = comm_for(process_group, no_dist)
    p = _prepare_on_every_rank(state_dict, comm, for_load=False, agree=True)
    _process_saver().prepare(p.sd, comm)


def load(state_dict: Dict[str, Any], checkpoint_id: "os.PathLike | str", *,
         process_group: Any = None, no_dist: bool = False, broadcast: bool = True,
         allow_partial: bool = False, strip_prefix: str = "",
         add_prefix: str = "") -> _dcp.LoadResult:
    """Loads the checkpoint into `state_dict`, resharding as needed; every rank calls it.

    Tensors are filled in place; non-tensor values are replaced by the saved ones. The
    checkpoint may come from any number of ranks and any layout. `broadcast`: a shard that
    several ranks hold is read once and broadcast. `allow_partial`: entries the checkpoint
    lacks keep their values. `strip_prefix`/`add_prefix` rename the checkpoint's entries
    before matching.
    """
    comm = comm_for(process_group, no_dist)
    p = _prepare_on_every_rank(state_dict, comm, for_load=True, agree=True)
    result = _dcp.load(p.sd, os.fspath(checkpoint_id), comm, broadcast, allow_partial,
                       strip_prefix, add_prefix)
    finish_load(p, state_dict)
    return result


def finish_load(p: Any, state_dict: Dict[str, Any]) -> None:
    """After the engine filled `p.sd`: copies staged chunks back into their tensors and
    replaces the non-tensor values of `state_dict` with the loaded ones."""
    for chunk in p.chunks:
        if chunk.write_back is not None:
            chunk.write_back()
    loaded: Dict[str, Any] = {}
    for fqn in p.values:
        data = p.sd.bytes_of(fqn)
        if data:  # empty: skipped by a partial load (a stored value is never empty)
            loaded[fqn] = _values.decode(fqn, data)
    replace_leaves(state_dict, loaded)
