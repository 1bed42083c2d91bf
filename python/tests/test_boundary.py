"""The Python boundary with real torchrun jobs: Ctrl-C on one rank, a timeout set on one rank,
a first call made by one rank, values that differ, and exits with saves in flight; and the
package on a machine where Open MPI cannot be loaded."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hyperdcp as dcp
from conftest import WORKERS, free_port


@pytest.mark.parametrize("what", ["save", "load", "manager", "result"])
def test_sigint_on_one_rank(torchrun, tmp_path, what):
    out = torchrun(2, "boundary.py", f"sigint-{what}", tmp_path, timeout=200)
    assert out.count(": ok") == 2, out
    m = re.search(r"rank 1: interrupted after ([0-9.]+) s", out)
    assert m, out
    # Well before rank 0 arrives (12 s later): the interrupt did not wait for the collective.
    # (A bound far above the ~0.01 s measured, so that a loaded CI machine cannot fail it.)
    assert float(m.group(1)) < 8, out


@pytest.mark.parametrize("case", ["timeout-one-rank", "first-call-on-one-rank",
                                  "values-differ", "resume-fallback"])
def test_failures_name_the_rank(torchrun, tmp_path, case):
    out = torchrun(2, "boundary.py", case, tmp_path, timeout=200)
    assert out.count(": ok") == 2, out


def test_values_saved_per_rank_load_rank_0s_into_another_world(torchrun, tmp_path, caplog):
    """A value 2 ranks saved per rank, loaded by one process: rank 0's, with a warning."""
    import logging

    import hyperdcp as dcp

    torchrun(2, "boundary.py", "values-differ", tmp_path, timeout=200)
    back = {"seed": 0, "same": ""}
    with caplog.at_level(logging.WARNING, logger="hyperdcp"):
        dcp.load(back, tmp_path / "differ", allow_partial=True)
    assert back == {"seed": 1234, "same": "x"}
    assert "'seed' was saved per rank" in caplog.text and "loads rank 0's value" in caplog.text
    # Converted to torch's format: one value per name, rank 0's.
    import torch.distributed.checkpoint as torch_dcp

    dcp.to_torch_dcp(tmp_path / "differ", tmp_path / "as-torch")
    back = {"seed": 0, "same": ""}
    torch_dcp.load(back, checkpoint_id=tmp_path / "as-torch", planner=torch_dcp.DefaultLoadPlanner(
        allow_partial_load=True))
    assert back == {"seed": 1234, "same": "x"}


def run_job(nproc: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(WORKERS / "boundary.py"), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=str(WORKERS))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("how, status", [("end", 0), ("raise", 1), ("destroy", 0)])
def test_exit_with_saves_in_flight(tmp_path, how, status):
    p = run_job(2, f"exit-{how}", str(tmp_path))
    text = p.stdout + p.stderr
    assert p.returncode == status, text
    assert "terminate called" not in text and "SIGABRT" not in text, text
    assert text.count(": ok") == 2, text
    # The in-flight manager save finished at exit: step 2 is the newest complete step.
    mgr = dcp.CheckpointManager(tmp_path / "mgr", no_dist=True)
    assert mgr.latest_step() == 2, mgr.steps()
    got = {"w": torch.zeros(1 << 21), "step": 0}
    mgr.load(got)
    assert got["step"] == 2 and torch.equal(got["w"], torch.full((1 << 21,), 2.0))
    mgr.close()
    plain = {"w": torch.zeros(1 << 21), "step": 0}
    dcp.load(plain, tmp_path / "plain")
    assert plain["step"] == 2


def test_async_saves_while_the_interpreter_exits(tmp_path):
    """An async save from an atexit hook, and one from a non-daemon thread after the main
    thread returned (when no waiter pool takes work any more): each completes its future and
    commits; the process exits 0."""
    code = f"""
import atexit, threading, torch, hyperdcp as dcp
def at_exit():
    f = dcp.async_save({{"w": torch.full((1000,), 3.0)}}, "{tmp_path}/atexit", no_dist=True)
    print("atexit", f.result(timeout=120) is not None, flush=True)
atexit.register(at_exit)
def late():
    threading.main_thread().join()  # returned, and the interpreter's threading exit ran
    import concurrent.futures.thread as pool
    assert pool._shutdown  # no pool takes work any more: the future's fallback is used
    f = dcp.async_save({{"w": torch.full((1000,), 2.0)}}, "{tmp_path}/thread", no_dist=True)
    print("thread", f.result(timeout=120) is not None, flush=True)
threading.Thread(target=late).start()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "thread True" in out.stdout and "atexit True" in out.stdout, out.stdout + out.stderr
    for name, value in (("thread", 2.0), ("atexit", 3.0)):
        got = dcp.load_all(tmp_path / name)
        assert torch.equal(got["w"], torch.full((1000,), value)), name


def test_engine_calls_queue_on_one_kept_helper():
    """A call made by a signal handler while another call runs waits for it (never beside it
    on the same communicator); a helper whose thread ended is replaced; where no thread can
    start (the interpreter exiting), calls run on the main thread."""
    import signal
    import threading
    import time

    from hyperdcp import _boundary

    comm = dcp._dcp.local_comm()
    spans = {}

    def timed(name, seconds):
        def run():
            t0 = time.monotonic()
            time.sleep(seconds)
            spans[name] = (t0, time.monotonic())
            return name
        return run

    def handler(signum, frame):
        assert _boundary.call(comm, timed("nested", 0.05)) == "nested"

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        assert _boundary.call(comm, timed("outer", 0.6)) == "outer"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert spans["nested"][0] >= spans["outer"][1], spans  # after it, not beside it
    helper = _boundary._helper
    helper.jobs.put(None)  # its thread ends
    helper.thread.join(10)
    assert _boundary.call(comm, lambda: 7) == 7 and _boundary._helper is not helper


def test_without_threads_calls_and_futures_complete_inline(tmp_path, monkeypatch):
    """Where no thread can start (Python 3.12+ once the interpreter exits), an engine call
    runs on the calling thread and an async save's future completes before async_save
    returns."""
    import threading

    from hyperdcp import _api, _boundary

    def refuse(*args, **kwargs):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(_boundary, "_helper", None)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    monkeypatch.setattr(_api._waiters(), "submit", refuse)
    comm = dcp._dcp.local_comm()
    assert _boundary.call(comm, lambda: threading.current_thread()) is threading.main_thread()
    f = dcp.async_save({"w": torch.full((1000,), 4.0)}, tmp_path / "ck", no_dist=True)
    assert f.done() and f.result() is not None
    monkeypatch.undo()
    assert torch.equal(dcp.load_all(tmp_path / "ck")["w"], torch.full((1000,), 4.0))


def test_import_and_save_without_open_mpi(tmp_path):
    """The core extension links no MPI library, and works where libmpi cannot be loaded."""
    import hyperdcp._dcp as core

    ldd = subprocess.run(["ldd", core.__file__], capture_output=True, text=True, check=True)
    assert "libmpi" not in ldd.stdout, ldd.stdout
    # A libmpi that cannot be loaded shadows the real one.
    broken = tmp_path / "broken-lib"
    broken.mkdir()
    for name in ("libmpi.so.40", "libmpi.so", "libopen-pal.so.40", "libopen-rte.so.40"):
        (broken / name).write_bytes(b"not a library")
    code = (
        "import ctypes, torch, hyperdcp as dcp\n"
        "try:\n"
        "    ctypes.CDLL('libmpi.so.40')\n"
        "    raise SystemExit('libmpi loaded')\n"
        "except OSError:\n"
        "    pass\n"
        f"dcp.save({{'t': torch.arange(4.0), 'step': 3}}, {str(tmp_path / 'ck')!r})\n"
        "sd = {'t': torch.zeros(4), 'step': 0}\n"
        f"dcp.load(sd, {str(tmp_path / 'ck')!r})\n"
        "assert sd['step'] == 3 and sd['t'].tolist() == [0, 1, 2, 3]\n"
        "print('ok')\n")
    env = dict(os.environ, LD_LIBRARY_PATH=str(broken))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
