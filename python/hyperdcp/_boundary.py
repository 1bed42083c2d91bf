"""The one place where Python hands control to the engine, and takes it back.

- Interruptible: an engine call made from the main thread runs on a helper thread while the
  main thread waits in short, signal-aware waits. Ctrl-C (or any exception a signal handler
  raises, SystemExit from a SIGTERM handler included) reaches the caller: the call's job is
  marked failed, which ends its collectives here at once and, through the store, on the other
  ranks (they raise an error naming this rank). The caller gets the original exception once
  the engine stopped touching its memory: at the next collective, or when the I/O in flight
  ends.
- Exceptions kept: an exception raised inside a collective (gloo's own error, a peer's abort)
  is re-raised as it was, not folded into the engine's text.
- Serialised: engine calls from several Python threads take one lock, in turn.
- Closed at exit: every async saver and manager is closed by one atexit hook, so that a save in
  flight finishes (or fails, leaving the previous checkpoint) while the interpreter is whole,
  and the process exits with the script's own status; then hyperdcp's own gloo groups are
  closed, so that their threads never free tensors during finalization.
"""

import atexit
import os
import queue
import threading
import weakref
from typing import Any, Callable, Optional, TypeVar

from . import _comm
from ._errors import DcpError

T = TypeVar("T")

_lock = threading.RLock()
_closables: "weakref.WeakSet[Any]" = weakref.WeakSet()
_process_closables: list = []  # closed last (the process-wide saver)
_POLL_S = 0.05


def serial() -> "threading.RLock":
    """The lock engine calls take (for quick calls that need no interrupt handling)."""
    return _lock


def register_closable(obj: Any, process_wide: bool = False) -> None:
    """`obj.close()` runs at exit (objects kept alive only by the caller; process-wide ones
    are closed after them)."""
    (_process_closables.append if process_wide else _closables.add)(obj)


@atexit.register
def _close_all() -> None:
    for obj in list(_closables) + _process_closables:
        try:
            obj.close()
        except BaseException as e:  # exit goes on; say why a save was lost
            import sys

            print(f"hyperdcp: closing {type(obj).__name__} at exit: {e}", file=sys.stderr)
    _comm.close_groups()  # last: the saves closed above used them


def _raise_kept(job: Optional[_comm.Job], first: int, engine_error: BaseException) -> None:
    """Re-raises the exception a collective raised during this call, if one did."""
    if job is None or len(job.errors) <= first:
        raise engine_error
    kept = job.errors[first]
    del job.errors[first:]
    if kept is engine_error:
        raise engine_error
    raise kept.with_traceback(kept.__traceback__) from engine_error


def call(comm: Any, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args), an engine call over `comm` that releases the GIL (see the module doc)."""
    with _lock:
        job = _comm.job_of(comm)
        if job is not None:
            job.check()
        first = len(job.errors) if job is not None else 0
        # MPI may be initialised for calls from the main thread only (MPI_THREAD_FUNNELED):
        # its calls run there, and only its own timeout ends them.
        # Where no thread can start (the interpreter exiting), here as well.
        on_main = threading.current_thread() is threading.main_thread()
        if not on_main or getattr(comm, "backend", "") == "mpi" or not _helper_ready():
            try:
                return fn(*args)
            except DcpError as e:
                _raise_kept(job, first, e)
        return _call_on_helper(job, first, fn, args)


class _Helper:
    """The thread that runs engine calls made from the main thread: kept between calls,
    since starting a thread per call cost the caller a millisecond or two (the thread's
    start is a handshake through the scheduler and the GIL). Calls queue on it in turn (one
    made by a signal handler during another waits for it). Daemon: while the main thread
    runs, it waits in the queue, so the interpreter's exit finds it idle."""

    def __init__(self) -> None:
        self.jobs: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="hyperdcp-engine", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:  # its caller left a call still running: ends after that call
                return
            fn, args, box, done = job
            del job
            try:
                box["result"] = fn(*args)
            except BaseException as e:
                box["error"] = e
            finally:
                done.set()
                del fn, args, box, done  # the caller's objects are not kept until the next call


_helper: Optional[_Helper] = None


def _forget_helper() -> None:  # a forked child has no thread behind the parent's helper
    global _helper
    _helper = None


os.register_at_fork(after_in_child=_forget_helper)


def _helper_ready() -> bool:
    """Whether the helper runs (started if need be); False where no thread can start."""
    global _helper
    if _helper is None or not _helper.thread.is_alive():
        try:
            _helper = _Helper()
        except RuntimeError:
            _helper = None
            return False
    return True


def _call_on_helper(job: Optional[_comm.Job], first: int, fn: Callable[..., T],
                    args: tuple) -> T:
    global _helper
    helper = _helper
    box: dict = {}
    done = threading.Event()
    helper.jobs.put((fn, args, box, done))
    interrupt: Optional[BaseException] = None
    try:
        while not done.is_set():
            try:
                done.wait(_POLL_S)
            except BaseException as e:  # KeyboardInterrupt, a signal handler's exception
                if interrupt is None:
                    interrupt = e
                    if job is not None:
                        job.fail(_interrupted(job, e), tell_others=True)
                # Keep waiting: the engine may be using the caller's memory until it returns.
    finally:
        if not done.is_set():  # left anyway (a second interrupt while telling the others)
            if _helper is helper:  # the next call gets a thread of its own
                _helper = None
            helper.jobs.put(None)
            if job is not None and job.failure is None:  # no later call may run beside it
                job.fail(_interrupted(job, KeyboardInterrupt()), tell_others=False)
    if interrupt is not None:
        raise interrupt
    if "error" in box:
        err = box.pop("error")
        if isinstance(err, DcpError):
            _raise_kept(job, first, err)
        raise err
    return box["result"]


def _interrupted(job: _comm.Job, e: BaseException) -> DcpError:
    from ._errors import error

    return error("UNAVAILABLE", f"rank {job.rank} of the process group left the collective: "
                 f"{type(e).__name__} raised there ({e or 'interrupted'})")
