"""Byte-string collectives over private gloo groups: the engine's communicator under torchrun.

hyperdcp never issues collectives on the caller's group: for each process group it derives a
gloo group of its own over the group's store, and the engine's groups (load's broadcast
groups, the async saver's communicator) are further gloo groups built from the same store by
their members alone (torch's new_group would need every rank of the default group).

A derived group and every group created from it share one `Job` record. What it adds to
gloo, which can neither be interrupted nor say who is missing:
- Every wait polls, so that a failure anywhere ends it early: this rank's own abort (Ctrl-C
  or a signal handler's exception in the caller's thread, see _boundary), or another rank's,
  which it posts in the store under the job's key. A failed job is unusable afterwards: its
  gloo groups are aborted and every later call raises the first failure.
- A rank that waits more than a second posts which call it waits in; on a timeout the ranks
  that did not post the same call are named as the ones that never arrived.
- Joining a new group goes through the store first, polled, so the connect of gloo never
  waits for a rank that is not coming: it times out naming the ranks that did not join.
"""

import ctypes
import threading
import time
import weakref
from collections import Counter
from datetime import timedelta
from typing import Any, List, Optional, Sequence, Tuple

from ._errors import DcpError, error

_STORE_POLL_S = 0.5  # how often a waiting rank looks for another rank's abort
_POST_AFTER_S = 1.0  # a rank that waits this long says in the store where it waits
_GLOO_MARGIN_S = 60.0  # gloo's own operation timeout comes this long after ours
# Message bytes that travel with the length in a collective's first round: most messages
# (agreements, statuses, small plans) fit, and then take one gloo round instead of two (a
# round across processes costs a millisecond or more on a busy host). Every rank receives
# every rank's first round, so large groups inline less (256 KiB per rank in all).
_INLINE = 4096
_FIRST_ROUND_BYTES = 256 << 10


def inline_bytes(size: int) -> int:
    """The bytes inlined in a group of `size` ranks: the same on every rank."""
    return min(_INLINE, _FIRST_ROUND_BYTES // max(size, 1))


class Job:
    """What a derived group and the groups created from it share: the store, the ranks of
    the caller's process group, and whether (and why) it failed."""

    def __init__(self, store: Any, prefix: str, rank: int, size: int, timeout_s: float):
        self.store, self.prefix, self.rank, self.size = store, prefix, rank, size
        self.timeout_s = timeout_s
        self.failure: Optional[DcpError] = None
        self.errors: List[BaseException] = []  # raised inside collectives, by thread
        self._groups: "weakref.WeakSet[GlooGroup]" = weakref.WeakSet()
        self._lock = threading.Lock()

    @property
    def abort_key(self) -> str:
        return f"{self.prefix}/abort"

    def fail(self, failure: DcpError, tell_others: bool) -> None:
        """Marks the job failed (the first failure stays) and aborts its gloo groups."""
        with self._lock:
            if self.failure is None:
                self.failure = failure
            groups = list(self._groups)
        if tell_others:
            try:
                self.store.set(self.abort_key, str(failure))
            except Exception:  # the store may be gone with rank 0: the others time out
                pass
        for g in groups:
            g.abort()

    def check(self) -> None:
        if self.failure is not None:
            raise error(self.failure.code, f"the communicator failed earlier and cannot be used "
                        f"again ({self.failure}); create a new process group")

    def poll_store(self) -> None:
        """Fails the job if another rank posted its abort."""
        try:
            if not self.store.check([self.abort_key]):
                return
            why = self.store.get(self.abort_key).decode(errors="replace")
        except Exception:
            return
        self.fail(error("UNAVAILABLE", why), tell_others=False)


class GlooGroup:
    """Byte-string collectives over a private ProcessGroupGloo (the `impl` of a PyComm).

    Ranks are this group's; `members` are their ranks in the job's process group.
    """

    def __init__(self, job: Job, prefix: str, members: Sequence[int]):
        import torch.distributed as dist

        self._job, self._prefix, self._members = job, prefix, list(members)
        self._rank, self._size = self._members.index(job.rank), len(self._members)
        self._calls = 0
        self._created: Counter = Counter()
        try:
            self._join()
        except BaseException as e:  # Ctrl-C while joining: the others must not wait for us
            if not isinstance(e, DcpError):
                job.fail(error("UNAVAILABLE", f"rank {job.rank} of the process group left "
                               f"while joining a group: {type(e).__name__} raised there"),
                         tell_others=True)
            raise
        self._pg = dist.ProcessGroupGloo(
            dist.PrefixStore(prefix + "/", job.store), self._rank, self._size,
            timedelta(seconds=job.timeout_s + _GLOO_MARGIN_S))
        job._groups.add(self)

    # -- failure handling ------------------------------------------------------------------
    def _join(self) -> None:
        """Waits until every member posted its arrival, naming those that did not."""
        store, job = self._job.store, self._job
        store.set(f"{self._prefix}/join/{job.rank}", b"1")
        keys = [f"{self._prefix}/join/{m}" for m in self._members]
        deadline = time.monotonic() + job.timeout_s
        delay = 0.001
        while not store.check(keys):
            job.check()
            job.poll_store()
            if time.monotonic() > deadline:
                missing = [m for m, k in zip(self._members, keys) if not store.check([k])]
                failure = error("DEADLINE_EXCEEDED",
                                f"hyperdcp: ranks {missing} of the process group never joined "
                                f"a group of ranks {self._members} within {job.timeout_s:g} s "
                                "(stopped, or not calling the same hyperdcp function)")
                job.fail(failure, tell_others=False)
                raise failure
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def abort(self) -> None:
        try:
            if self._pg is not None:
                self._pg.abort()
        except Exception:
            pass

    @property
    def _live(self) -> Any:
        """The ProcessGroupGloo, unless closed at exit."""
        if self._pg is None:
            raise error("UNAVAILABLE", "hyperdcp: the process is exiting: its gloo groups are "
                        "closed")
        return self._pg

    def close(self) -> None:
        """At exit, while the interpreter is whole: the group's threads end now and the tensors
        they last held are freed with the GIL available. Freed during finalization instead, a
        thread taking the GIL is ended by Python, which aborts the process (SIGABRT,
        "terminate called without an active exception"; torch#179291)."""
        pg, self._pg = self._pg, None
        del pg

    def _missing(self, call: int) -> List[int]:
        store, out = self._job.store, []
        for m in self._members:
            if m == self._job.rank:
                continue
            key = f"{self._prefix}/waiting/{m}"
            try:
                posted = int(store.get(key)) if store.check([key]) else -1
            except Exception:
                posted = -1
            if posted < call:
                out.append(m)
        return out

    def _wait(self, work: Any, op: str, timeout_s: float, owned: bool = True) -> None:
        """Waits for `work`, polling (see the module doc). `owned`: its buffers are tensors of
        ours, which the work keeps alive; else (broadcast_into) the engine's memory, which the
        engine frees once we return, so a failed wait first lets the operation end."""
        job = self._job
        self._calls += 1
        call = self._calls
        start = time.monotonic()
        deadline, next_poll, posted = start + timeout_s, start + _STORE_POLL_S, False
        # Short sleeps first (most operations end within a millisecond or two, and every
        # poll past the end is latency added to the call), longer ones for a long wait.
        delay = 0.00005
        while not work.is_completed():
            now = time.monotonic()
            if job.failure is None and now >= next_poll:
                job.poll_store()
                next_poll = now + _STORE_POLL_S
            if not posted and now - start > _POST_AFTER_S:
                job.store.set(f"{self._prefix}/waiting/{job.rank}", str(call).encode())
                posted = True
            if job.failure is None and now > deadline:
                missing = self._missing(call)
                who = (f"ranks {missing} of the process group never arrived (stopped, or busy "
                       "outside hyperdcp)") if missing else "every rank arrived, gloo did not end it"
                job.fail(error("DEADLINE_EXCEEDED",
                               f"hyperdcp: {op} (call {call}) timed out after "
                               f"{timeout_s:g} s on rank {job.rank}: {who}"),
                         tell_others=True)
            if job.failure is not None:
                if not owned:
                    self._settle(work)
                job.check()
            time.sleep(delay)
            delay = min(delay * 1.5, 0.001 if now - start < 0.2 else 0.01)
        try:
            work.wait()  # raises gloo's error of a completed, failed operation
        except Exception:
            # A peer that failed closes its connections: its posted reason says more than
            # gloo's "connection closed", and names it.
            if job.failure is None:
                job.poll_store()
            job.check()
            raise

    @staticmethod
    def _settle(work: Any) -> None:
        # The group was aborted: the operation ends soon (with an error). Wait for it, since
        # gloo may still write into its buffers, which the engine frees once we return.
        deadline = time.monotonic() + 30
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _run(self, op: str, fn: Any) -> Any:
        """fn() with the job checked first; an exception is recorded for the caller."""
        self._job.check()
        try:
            return fn()
        except BaseException as e:
            if not isinstance(e, DcpError):
                self._job.fail(error("UNAVAILABLE", f"rank {self._job.rank}: {op} failed: "
                                     f"{type(e).__name__}: {e}"), tell_others=True)
            self._job.errors.append(e)
            raise

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _opts(cls_name: str, timeout_s: float, **fields: Any) -> Any:
        import torch._C._distributed_c10d as c10d

        opts = getattr(c10d, cls_name)()
        # Later than our own deadline (_wait), which names the missing ranks; gloo's own
        # timeout only ends an operation that our abort did not.
        opts.timeout = timedelta(seconds=timeout_s + _GLOO_MARGIN_S)
        for k, v in fields.items():
            setattr(opts, k, v)
        return opts

    @staticmethod
    def _as_tensor(data: bytes, length: int, skip: int = 0) -> Any:
        """`length` bytes: data[skip:] then zeros."""
        import torch

        t = torch.zeros(length, dtype=torch.uint8)
        data = bytes(data)  # its own buffer, addressed below (no copy of a bytes object)
        n = min(len(data) - skip, length)
        if n > 0:
            src = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
            ctypes.memmove(t.data_ptr(), src + skip, n)
        return t

    @staticmethod
    def _to_bytes(t: Any, n: int) -> bytes:
        return ctypes.string_at(t.data_ptr(), n) if n else b""

    def _head(self, data: bytes) -> Any:
        """The first round's message: the length (8 bytes) and the first inlined bytes."""
        inline = inline_bytes(self._size)
        return self._as_tensor(len(data).to_bytes(8, "little") + data[:inline], 8 + inline)

    def _unhead(self, t: Any) -> Tuple[int, bytes]:
        inline = inline_bytes(self._size)
        raw = ctypes.string_at(t.data_ptr(), 8 + inline)
        n = int.from_bytes(raw[:8], "little")
        return n, raw[8:8 + min(n, inline)]

    def _all_heads(self, data: bytes, timeout_s: float) -> List[Tuple[int, bytes]]:
        """Every rank's (length, first bytes), in one round."""
        import torch

        heads = [torch.empty(8 + inline_bytes(self._size), dtype=torch.uint8)
                 for _ in range(self._size)]
        self._wait(self._live.allgather([heads], [self._head(data)],
                                      self._opts("AllgatherOptions", timeout_s)), "all_gather", timeout_s)
        return [self._unhead(h) for h in heads]

    # -- the PyComm interface --------------------------------------------------------------
    def all_gather(self, data: bytes, timeout_s: float) -> List[bytes]:
        def go() -> List[bytes]:
            import torch

            heads = self._all_heads(data, timeout_s)
            inline = inline_bytes(self._size)
            rest = max(n for n, _ in heads) - inline
            if rest <= 0:
                return [b for _, b in heads]
            out = [torch.empty(rest, dtype=torch.uint8) for _ in range(self._size)]
            self._wait(self._live.allgather([out], [self._as_tensor(data, rest, inline)],
                                          self._opts("AllgatherOptions", timeout_s)),
                       "all_gather", timeout_s)
            return [b + self._to_bytes(t, max(0, n - inline)) for (n, b), t in zip(heads, out)]

        return self._run("all_gather", go)

    def gather(self, data: bytes, root: int, timeout_s: float) -> List[bytes]:
        def go() -> List[bytes]:
            import torch

            # Every rank learns every length (so that all agree on a second round).
            heads = self._all_heads(data, timeout_s)
            inline = inline_bytes(self._size)
            mine = root == self._rank
            rest = max(n for n, _ in heads) - inline
            if rest <= 0:
                return [b for _, b in heads] if mine else []
            out = [torch.empty(rest, dtype=torch.uint8) for _ in range(self._size)] \
                if mine else []
            self._wait(self._live.gather([out] if mine else [],
                                       [self._as_tensor(data, rest, inline)],
                                       self._opts("GatherOptions", timeout_s, rootRank=root)),
                       "gather", timeout_s)
            if not mine:
                return []
            return [b + self._to_bytes(t, max(0, n - inline)) for (n, b), t in zip(heads, out)]

        return self._run("gather", go)

    def broadcast(self, data: bytes, root: int, timeout_s: float) -> bytes:
        def go() -> bytes:
            inline = inline_bytes(self._size)
            head = self._head(data if self._rank == root else b"")
            self._wait(self._live.broadcast(
                [head], self._opts("BroadcastOptions", timeout_s, rootRank=root)), "broadcast", timeout_s)
            n, first = self._unhead(head)
            if n <= inline:
                return first
            buf = self._as_tensor(data if self._rank == root else b"", n - inline, inline)
            self._wait(self._live.broadcast(
                [buf], self._opts("BroadcastOptions", timeout_s, rootRank=root)), "broadcast", timeout_s)
            return first + self._to_bytes(buf, n - inline)

        return self._run("broadcast", go)

    def broadcast_into(self, view: memoryview, root: int, timeout_s: float) -> None:
        def go() -> None:
            import torch

            if len(view) == 0:  # the same size on every rank: all skip alike
                return
            buf = torch.frombuffer(view, dtype=torch.uint8)  # the engine's memory, no copy
            self._wait(self._live.broadcast(
                [buf], self._opts("BroadcastOptions", timeout_s, rootRank=root)), "broadcast",
                timeout_s, owned=False)

        return self._run("broadcast", go)

    def barrier(self, timeout_s: float) -> None:
        self._run("barrier", lambda: self._wait(
            self._live.barrier(self._opts("BarrierOptions", timeout_s)), "barrier", timeout_s))

    def create_group(self, ranks: List[int]) -> Tuple["GlooGroup", int, int]:
        # Members create a group in the same order (the Comm contract), so the n-th creation
        # of the same member list has the same name on each of them.
        def go() -> Tuple["GlooGroup", int, int]:
            key = ",".join(map(str, ranks))
            n = self._created[key]
            self._created[key] += 1
            group = GlooGroup(self._job, f"{self._prefix}/{key}#{n}",
                              [self._members[r] for r in ranks])
            return group, group._rank, group._size

        return self._run("create_group", go)
