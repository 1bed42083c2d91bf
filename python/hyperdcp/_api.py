"""save / async_save / load with torch.distributed.checkpoint's signatures, on the engine
(docs/python.md)."""

import concurrent.futures
import concurrent.futures.thread  # now: it cannot be imported once the interpreter exits
import math
import os
import sys
import threading
import time
from typing import Any, Dict, Optional

from . import _boundary, _dcp, _delegate
from ._comm import comm_for
from ._errors import DcpError, error, invalid_argument
from ._formats import COMMITTED, PROBE, holds_torch_format
from ._load_engine import load_directory
from ._optimizers import fill_empty_optimizers
from ._prepare import Prepared, failure_text, prepare_on_every_rank, release
from ._torch_args import Delegate, HfTarget, load_source, location, save_target, staging



def _committed(directory: str) -> bool:
    if directory.startswith("s3://"):  # an object store: ask the engine, which reads it there
        try:
            _dcp.read_metadata(directory)
            return True
        except DcpError:
            return False
    # hyperdcp's checkpoint, or torch's (whose `.metadata` a hyperdcp commit replaces with
    # its probe).
    return any(os.path.exists(os.path.join(directory, name)) for name in (COMMITTED, PROBE))


def _refuse_overwrite(directory: str, overwrite: bool) -> None:
    if not overwrite and _committed(directory):
        raise error("FAILED_PRECONDITION",
                    f"{directory} holds a checkpoint already and overwrite=False: choose "
                    "another directory, or pass overwrite=True")


def _prepare_save(state_dict: Any, comm: Any, directory: str, overwrite: bool, agree: bool,
                  allow_pickle: bool) -> Prepared:
    return prepare_on_every_rank(state_dict, comm, for_load=False, agree=agree,
                                 allow_pickle=allow_pickle,
                                 precheck=lambda: _refuse_overwrite(directory, overwrite))


def _timed(result: Any, p: Prepared, started: float) -> Any:
    """The engine's result with the Python side's share of the call added."""
    result.python_seconds = p.python_seconds() - result.total_seconds
    result.call_seconds = time.perf_counter() - started
    return result


def _finite(timeout: Optional[float]) -> Optional[float]:
    """A Future's timeout: inf means no timeout (None), as in hyperdcp's other waits."""
    return None if timeout is not None and math.isinf(timeout) and timeout > 0 else timeout


def save(state_dict: Dict[str, Any], checkpoint_id: "os.PathLike | str | None" = None, *,
         storage_writer: Any = None, planner: Any = None, process_group: Any = None,
         no_dist: bool = False, use_collectives: bool = True, step: int = 0,
         overwrite: Optional[bool] = None, allow_pickle: bool = False,
         incremental_base: "os.PathLike | str | None" = None) -> _dcp.SaveResult:
    """Saves `state_dict` into the directory `checkpoint_id`; every rank of the group calls it.

    torch.distributed.checkpoint.save's signature and meaning (Stateful objects saved through
    state_dict(), lists and values as torch flattens them). Tensors are written from their
    own memory (CPU) or one host copy (device memory); non-tensor values are stored typed,
    never pickled unless `allow_pickle`. `overwrite=False` (or FileSystemWriter(...,
    overwrite=False)) refuses a directory holding a committed checkpoint, before any write.
    `step`: without collectives, the save's identity (docs/failure-modes.md, "Saves without
    collectives").
    `incremental_base`: a committed checkpoint in a sibling directory; tensors' chunks it holds
    unchanged are referenced, not written again (docs/incremental.md). Returns this rank's
    SaveResult (`call_seconds`: the whole call as the caller waited; `python_seconds`: the
    Python side's share; `bytes_referenced`: left in the base).
    """
    started = time.perf_counter()
    target = save_target(checkpoint_id, storage_writer, planner)
    base = _base_of(incremental_base, target)
    if isinstance(target, Delegate):
        return _delegate.save(target, state_dict, checkpoint_id, storage_writer, planner,
                              process_group, no_dist, use_collectives)
    if isinstance(target, HfTarget):
        if base:
            raise invalid_argument("incremental_base: a HuggingFace save writes whole files")
        return _save_hf(state_dict, target, comm_for(process_group, no_dist), started)
    directory, writer_overwrite = target
    overwrite = writer_overwrite if overwrite is None else overwrite
    comm = comm_for(process_group, no_dist)
    p = _prepare_save(state_dict, comm, directory, overwrite, use_collectives, allow_pickle)
    try:
        result = _boundary.call(comm, _dcp.save, p.sd, directory, comm, use_collectives, step,
                                base)
    finally:
        release(p)
    return _timed(result, p, started)


def _save_hf(state_dict: Any, target: HfTarget, comm: Any, started: float) -> Any:
    """torch's HuggingFaceStorageWriter's files, written by the engine (docs/huggingface.md)."""
    p = prepare_on_every_rank(state_dict, comm, for_load=False, agree=True)
    try:
        result = _boundary.call(comm, _dcp.save_torch_hf, p.sd, target.directory, comm,
                                list(target.fqn_to_index), target.save_distributed,
                                target.consolidate_into)
    finally:
        release(p)
    return _timed(result, p, started)


def _base_of(incremental_base: Any, target: Any) -> str:
    """The incremental base as the engine takes it (resolved as checkpoint ids are); "": none."""
    if incremental_base is None:
        return ""
    if isinstance(target, Delegate):
        raise invalid_argument(f"incremental_base needs a save hyperdcp serves ({target.reason})")
    base = location(incremental_base)
    if isinstance(base, Delegate):
        raise invalid_argument(f"incremental_base: {base.reason}")
    return base


def load(state_dict: Dict[str, Any], checkpoint_id: "os.PathLike | str | None" = None, *,
         storage_reader: Any = None, planner: Any = None, process_group: Any = None,
         no_dist: bool = False, broadcast: bool = True, allow_partial: bool = False,
         strip_prefix: str = "", add_prefix: str = "", verify_checksums: bool = True,
         max_open_files: int = 8, allow_pickle: bool = False,
         device: Any = None, max_broadcast_buffer_bytes: Optional[int] = None,
         broadcast_cached: bool = False) -> _dcp.LoadResult:
    """Loads the checkpoint into `state_dict`, resharding as needed; every rank calls it.

    torch.distributed.checkpoint.load's signature and meaning: tensors are filled in place;
    non-tensor values replace the template's (whatever the template's list or dict held);
    Stateful objects get load_state_dict() with their loaded state dict. The checkpoint may
    come from any number of ranks and any layout. `broadcast`: a shard several ranks need is
    read once and broadcast, unless every rank finds what it reads in its page cache (then each
    copies it from memory; `broadcast_cached=True` broadcasts anyway). `allow_partial` (or DefaultLoadPlanner(allow_partial_load=True)):
    entries the checkpoint lacks keep their values. `strip_prefix`/`add_prefix` rename the
    checkpoint's entries before matching. `verify_checksums`: every byte read is checked.
    `max_broadcast_buffer_bytes`: host memory per rank for collectives in flight beyond the
    destination (packs of small shards, stored chunks a reshard shares; None: the engine's
    default, 256 MiB);
    r.peak_broadcast_buffer_bytes says what the load held.
    A tensor of the template on the meta device (a model built on meta) is allocated (on the
    CPU, or on `device`), loaded, and put in the state dict in its place, as torch does: then
    `model.load_state_dict(state_dict, assign=True)`.
    """
    started = time.perf_counter()
    source = load_source(checkpoint_id, storage_reader, planner, allow_partial)
    if not isinstance(source, Delegate) and _torch_format(source[0]):
        source = Delegate(f"{source[0]} holds a checkpoint in torch DCP's format")
    if isinstance(source, Delegate):
        return _delegate.load(source, state_dict, checkpoint_id, storage_reader, planner,
                              process_group, no_dist, allow_partial)
    directory, allow_partial = source
    fill_empty_optimizers(state_dict, directory)
    comm = comm_for(process_group, no_dist)
    result, p = load_directory(state_dict, directory, comm, broadcast=broadcast,
                               allow_partial=allow_partial, strip_prefix=strip_prefix,
                               add_prefix=add_prefix, verify_checksums=verify_checksums,
                               max_open_files=max_open_files, allow_pickle=allow_pickle,
                               device=device,
                               max_broadcast_buffer_bytes=max_broadcast_buffer_bytes,
                               broadcast_cached=broadcast_cached)
    return _timed(result, p, started)


def _torch_format(directory: str) -> bool:
    # A checkpoint in torch's format needs torch to load (and a caller without it has none).
    return "torch" in sys.modules and holds_torch_format(directory)


_waiter_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
_waiter_lock = threading.Lock()


def _waiters() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that wait for saves to end and complete their futures: one per save in
    flight, kept for the saves that follow (starting a thread per save cost async_save's
    caller about a millisecond); past 64 saves in flight, later ones queue behind. The
    interpreter waits for them, so for the saves, before it exits."""
    global _waiter_pool
    with _waiter_lock:
        if _waiter_pool is None:
            _waiter_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=64, thread_name_prefix="hyperdcp-save-waiter")
        return _waiter_pool


def _forget_waiters() -> None:  # a forked child has none of the parent's threads
    global _waiter_pool, _waiter_lock
    _waiter_pool, _waiter_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_waiters)


class SaveFuture(concurrent.futures.Future):
    """An asynchronous save in progress: a concurrent.futures.Future of its SaveResult.

    result(), done(), exception() and add_done_callback() as any Future (callbacks run on a
    thread of hyperdcp's once the save is durable and committed on every rank), plus
    `staging` (what staging copied) and `blocked_seconds` (how long async_save blocked the
    caller, Python side included).
    """

    def __init__(self, handle: Any, blocked_seconds: float) -> None:
        super().__init__()
        self._handle = handle
        self.staging: _dcp.StagingStats = handle.staging
        self.blocked_seconds = blocked_seconds
        self.set_running_or_notify_cancel()
        try:
            _waiters().submit(self._finish)
        except RuntimeError:  # the interpreter is exiting (a save from an atexit hook, ...)
            try:
                threading.Thread(target=self._finish, name="hyperdcp-save-waiter").start()
            except RuntimeError:  # no thread can start any more: the save ends here
                self._finish()

    def _finish(self) -> None:
        try:
            r = self._handle.get()  # releases the GIL while it waits
        except BaseException as e:
            self.set_exception(e)
        else:
            self.set_result(r)

    def result(self, timeout: Optional[float] = None) -> _dcp.SaveResult:
        timeout = _finite(timeout)
        try:
            return super().result(timeout)
        except concurrent.futures.TimeoutError:
            # concurrent.futures' own class: before Python 3.11 it is not the built-in one, and
            # callers catch it by that name.
            raise concurrent.futures.TimeoutError(
                f"save to {self._handle.dir} still running after {timeout} s") from None

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        return super().exception(_finite(timeout))

    def cancel(self) -> bool:
        return False  # a save that started staging runs to its end


AsyncSaveHandle = SaveFuture  # the name of earlier versions

_saver: Optional[Any] = None
_saver_options: Dict[str, int] = {}
_saver_lock = threading.Lock()


def process_saver() -> Any:
    """The process's async saver (staging pool and persisting thread), closed at exit."""
    global _saver
    with _saver_lock:
        if _saver is None:
            _saver = _dcp.AsyncSaver(**_saver_options)
            _boundary.register_closable(_saver, process_wide=True)
        return _saver


def set_async_options(*, max_staging_bytes: int = 0, staging_threads: int = 0,
                      persist_nice: int = 10) -> None:
    """Options of the saver behind async_save (local to this process; call it before the
    first async_save, or it first finishes the saves in flight and frees the staging pool).

    `max_staging_bytes`: staging memory the saver may hold (0: one state dict's worth, so a
    save waits for the previous one's buffers); `staging_threads`: threads copying into
    staging (0: this node's CPUs divided by its ranks, 1 to 8); `persist_nice`: the nice
    value of the persisting thread (0: the caller's priority).
    """
    global _saver
    with _saver_lock:
        old, _saver = _saver, None
        _saver_options.update(max_staging_bytes=max_staging_bytes,
                              staging_threads=staging_threads, persist_nice=persist_nice)
    if old is not None:
        old.close()


def async_save(state_dict: Dict[str, Any], checkpoint_id: "os.PathLike | str | None" = None,
               *, storage_writer: Any = None, planner: Any = None, process_group: Any = None,
               async_checkpointer_type: Any = None, async_stager: Any = None,
               no_dist: bool = False, use_collectives: bool = True, step: int = 0,
               overwrite: Optional[bool] = None, allow_pickle: bool = False,
               incremental_base: "os.PathLike | str | None" = None) -> SaveFuture:
    """Like `save`, but returns once the state is copied to host staging memory.

    The tensors may be changed as soon as it returns. Planning, writing and the commit run
    on a background thread with a communicator of its own (never the caller's group). Saves
    persist one at a time, in call order. `async_checkpointer_type` (THREAD or PROCESS) is
    served the same way: hyperdcp persists on a thread of its own, outside the GIL.
    `async_stager`: a torch DefaultStager is served by hyperdcp's own reused, pre-faulted
    staging pool (whatever its options; the caller keeps closing it), and with
    use_async_staging the answer is torch's AsyncSaveResponse (staging_completion done, as
    staging ends before this returns; upload_completion this save's SaveFuture); any other
    stager goes to torch's own async_save. `incremental_base`: as save's.
    """
    started = time.perf_counter()
    response = staging(async_stager)
    target = response if isinstance(response, Delegate) else \
        save_target(checkpoint_id, storage_writer, planner)
    if isinstance(target, HfTarget):  # torch stages, then saves through save (hyperdcp's)
        target = Delegate("HuggingFaceStorageWriter: torch's async_save stages the state")
    base = _base_of(incremental_base, target)
    if isinstance(target, Delegate):
        return _delegate.async_save(target, state_dict, checkpoint_id, storage_writer, planner,
                                    process_group, async_checkpointer_type, async_stager,
                                    no_dist, use_collectives)
    directory, writer_overwrite = target
    overwrite = writer_overwrite if overwrite is None else overwrite
    comm = comm_for(process_group, no_dist)
    # No collective in the caller's way (a slower rank's preparation would block every rank):
    # prepared here alone; a rank whose preparation fails joins the save in the background
    # with its error, so that its peers' futures fail naming it instead of waiting.
    try:
        p = _prepare_save(state_dict, comm, directory, overwrite, False, allow_pickle)
    except BaseException as e:
        try:
            _boundary.call(comm, process_saver().fail, directory, comm, use_collectives,
                           *failure_text(e))
        except Exception as f:  # this rank's own error is the one to raise; say why peers wait
            print(f"hyperdcp: async_save to {directory}: could not tell the other ranks that "
                  f"this rank failed ({type(f).__name__}: {f}); they wait until the timeout",
                  file=sys.stderr)
        raise
    try:  # staged before it returns: the state dict is not used afterwards
        handle = _boundary.call(comm, process_saver().save, p.sd, directory, comm,
                                use_collectives, step, base)
    finally:
        release(p)
    future = SaveFuture(handle, time.perf_counter() - started)
    return _async_save_response(future) if response else future


def _async_save_response(future: SaveFuture) -> Any:
    """torch's answer to an async save with asynchronous staging, around this save."""
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    staged: concurrent.futures.Future = concurrent.futures.Future()
    staged.set_result(None)
    return AsyncSaveResponse(staging_completion=staged, upload_completion=future)


def prepare_async_save(state_dict: Dict[str, Any], *, process_group: Any = None,
                       no_dist: bool = False) -> None:
    """Gets `async_save` ready for `state_dict` ahead of its first call; every rank calls it.

    Allocates and pre-faults the host staging memory the state dict needs (kept for the
    saves that follow) and creates the saver's own communicator, so that the first
    `async_save` blocks only while it copies. Optional: call it once, after building the
    model and optimizer, before training.
    """
    comm = comm_for(process_group, no_dist)
    p = prepare_on_every_rank(state_dict, comm, for_load=False, agree=True)
    try:
        _boundary.call(comm, process_saver().prepare, p.sd, comm)
    finally:
        release(p)
