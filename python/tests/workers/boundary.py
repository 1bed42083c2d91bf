"""The Python boundary under torchrun: interrupts, timeouts, values that differ, exits.

Args: CASE DIR. Each case prints "rank R: ok" when every assertion held on that rank.
"""

import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import hyperdcp as dcp


def state(rank: int, n: int = 1 << 16) -> dict:
    return {"w": torch.full((n,), 1.0), "step": 1}  # the same on every rank (replicated)


def warm_up(root: str) -> None:
    """One save, so the derived communicator exists and the next call waits in a collective."""
    dcp.save({"w": torch.ones(4), "step": 0}, os.path.join(root, "warm"))


SIGINT_SENT = [0.0]  # when the timer sent SIGINT, so the delay is measured from the signal itself


def interrupt_after(seconds: float) -> None:
    def send() -> None:
        SIGINT_SENT[0] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)
    threading.Timer(seconds, send).start()


def since_sigint() -> float:
    return max(0.0, time.monotonic() - SIGINT_SENT[0])


def case_sigint(root: str, rank: int, what: str) -> None:
    """Rank 1 gets SIGINT while it waits for rank 0 inside save/load: KeyboardInterrupt there,
    soon; rank 0 then fails with an error naming rank 1, not after the timeout."""
    warm_up(root)
    if what == "result":
        # An async save that cannot finish while rank 0 is stopped (SIGSTOP, right after its
        # async_save returns): rank 1's result() waits, and is interrupted.
        pids = [None, None]
        dist.all_gather_object(pids, os.getpid())
        f = dcp.async_save(state(rank, 1 << 23), os.path.join(root, "ck"))
        if rank == 0:
            os.kill(os.getpid(), signal.SIGSTOP)
            f.result()
        else:
            interrupt_after(1.0)
            try:
                f.result()
            except KeyboardInterrupt:
                print(f"rank 1: interrupted after {since_sigint():.2f} s")
            else:
                raise AssertionError("no KeyboardInterrupt")
            finally:
                os.kill(pids[0], signal.SIGCONT)
            f.result()  # the save itself goes on
        return
    mgr = dcp.CheckpointManager(os.path.join(root, "mgr")) if what == "manager" else None
    if rank == 0:
        time.sleep(12)  # rank 1 waits in the collective when its SIGINT comes, long before this
    fn = {"save": lambda: dcp.save(state(rank), os.path.join(root, "ck")),
          "load": lambda: dcp.load(state(rank), os.path.join(root, "warm"), allow_partial=True),
          "manager": lambda: mgr.save(1, state(rank))}[what]
    if rank == 1:
        interrupt_after(1.0)
    start = time.monotonic()
    try:
        fn()
    except KeyboardInterrupt:
        assert rank == 1
        print(f"rank 1: interrupted after {since_sigint():.2f} s")
    except dcp.DcpError as e:
        assert rank == 0 and "rank 1" in str(e) and "KeyboardInterrupt" in str(e), str(e)
        print(f"rank 0: failed naming rank 1 after {time.monotonic() - start:.2f} s: {e}")
        # The communicator is unusable afterwards, with a clear error.
        try:
            dcp.save(state(rank), os.path.join(root, "again"))
        except dcp.DcpError as again:
            assert "failed earlier" in str(again), str(again)
        else:
            raise AssertionError("a failed communicator was used again")
    else:
        raise AssertionError(f"rank {rank}: no error")


def case_timeout_one_rank(root: str, rank: int) -> None:
    """set_timeout on rank 0 only (no hidden collective); rank 1 arrives late: rank 0 times
    out naming it."""
    warm_up(root)
    if rank == 0:
        dcp.set_timeout(3)
    else:
        time.sleep(12)
    try:
        dcp.save(state(rank), os.path.join(root, "late"))
    except dcp.DcpError as e:
        if rank == 0:
            assert e.code == "DEADLINE_EXCEEDED" and "[1]" in str(e), (e.code, str(e))
        else:
            assert "rank 0" in str(e) or "failed earlier" in str(e), str(e)
    else:
        raise AssertionError("no timeout")


def case_first_call_on_one_rank(root: str, rank: int) -> None:
    """`if rank == 0: dcp.save(...)` as the first call: rank 0 fails naming rank 1 (it never
    joined) within the timeout it set, instead of torch's store error after 10 minutes."""
    if rank == 0:
        dcp.set_timeout(3)
        try:
            dcp.save(state(rank), os.path.join(root, "solo"))
        except dcp.DcpError as e:
            assert e.code == "DEADLINE_EXCEEDED" and "ranks [1]" in str(e), str(e)
        else:
            raise AssertionError("no error")


def case_values_differ(root: str, rank: int) -> None:
    """Values that differ are kept per rank, in save and in async_save (each rank loads its
    own back, load_all included); one rank's preparation failing fails every rank."""
    sd = {"w": torch.ones(2), "seed": 1234 + rank, "same": "x", "nested": {"pos": [rank]}}
    dcp.save(sd, os.path.join(root, "differ"))
    dcp.async_save(sd, os.path.join(root, "differ-async")).result(timeout=120)
    for d in ("differ", "differ-async"):
        back = {"w": torch.zeros(2), "seed": 0, "same": "", "nested": {"pos": []}}
        dcp.load(back, os.path.join(root, d))
        assert back["seed"] == 1234 + rank and back["nested"]["pos"] == [rank], back
        assert back["same"] == "x", back
        everything = dcp.load_all(os.path.join(root, d))
        assert everything["seed"] == 1234 + rank and everything["nested"] == {"pos": [rank]}, \
            everything
        # torch's own load through hyperdcp's reader: each rank its own too.
        from hyperdcp._delegate import torch_function

        through_torch = {"seed": 0, "same": ""}
        torch_function("load")(through_torch, storage_reader=dcp.HyperdcpReader(
            os.path.join(root, d)))
        assert through_torch == {"seed": 1234 + rank, "same": "x"}, through_torch
    # Rank 1 cannot prepare its state (a value that needs pickling): it raises at once; rank
    # 0's save fails naming rank 1 and the entry, rather than waiting for it.
    bad = {"w": torch.ones(2), "step": 1, "hook": (lambda: 0) if rank == 1 else 0}
    try:
        f = dcp.async_save(bad, os.path.join(root, "one-rank-fails"))
        f.result(timeout=120)
    except dcp.DcpError as e:
        assert "'hook'" in str(e), str(e)
        assert rank == 1 or "rank 1: " in str(e), str(e)
    else:
        raise AssertionError("a state rank 1 could not prepare was saved")
    # The job goes on: the next async save on both ranks is a matched one.
    dcp.async_save(state(rank), os.path.join(root, "after")).result(timeout=120)
    assert os.path.exists(os.path.join(root, "after", "dcp.metadata"))


def case_resume_fallback(root: str, rank: int) -> None:
    """Two ranks resume from a root whose newest step has a flipped byte (same size): both
    fall back to the step before, alike, and the bad step is marked on disk."""
    mroot = os.path.join(root, "mgr")
    with dcp.CheckpointManager(mroot) as mgr:
        for step in (1, 2):
            mgr.save(step, {"w": torch.full((1 << 12,), float(step)), "step": step})
    dist.barrier()
    if rank == 0:
        d = os.path.join(mroot, "step_000000002")
        for name in os.listdir(d):
            if name.endswith(".safetensors"):
                with open(os.path.join(d, name), "r+b") as f:
                    f.seek(-1, os.SEEK_END)
                    last = f.read(1)
                    f.seek(-1, os.SEEK_END)
                    f.write(bytes([last[0] ^ 0xFF]))
    dist.barrier()
    with dcp.CheckpointManager(mroot) as mgr:
        got = {"w": torch.zeros(1 << 12), "step": 0}
        r = mgr.load(got)
        assert r.step == 1 and "step 2" in r.fell_back, (r.step, r.fell_back)
        assert got["step"] == 1 and torch.equal(got["w"], torch.full((1 << 12,), 1.0))
        assert mgr.steps() == [1]
    assert os.path.exists(os.path.join(mroot, "step_000000002", "dcp.bad"))


MGR = None  # module level: finalised with the interpreter


def case_exit_in_flight(root: str, rank: int, how: str) -> None:
    """A manager's async save (and a plain async save) in flight when the script ends."""
    global MGR
    MGR = dcp.CheckpointManager(os.path.join(root, "mgr"), keep_last=2)
    big = {"w": torch.full((1 << 21,), 1.0), "step": 1}  # the same on every rank
    MGR.save(1, big)
    big["w"].fill_(2.0)
    big["step"] = 2
    MGR.async_save(2, big)
    dcp.async_save(big, os.path.join(root, "plain"))
    print(f"rank {rank}: ok", flush=True)
    if how == "raise":
        raise RuntimeError("the script fails with saves in flight")
    if how == "destroy":
        dist.destroy_process_group()
    # "end": falls off the end


def main() -> None:
    case, root = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if case.startswith("sigint-"):
        case_sigint(root, rank, case.split("-", 1)[1])
    elif case == "timeout-one-rank":
        case_timeout_one_rank(root, rank)
    elif case == "first-call-on-one-rank":
        case_first_call_on_one_rank(root, rank)
    elif case == "values-differ":
        case_values_differ(root, rank)
    elif case == "resume-fallback":
        case_resume_fallback(root, rank)
    elif case.startswith("exit-"):
        case_exit_in_flight(root, rank, case.split("-", 1)[1])
        return
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    main()
