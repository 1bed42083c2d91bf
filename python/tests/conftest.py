"""Fixtures: run a worker script under torchrun (real processes, gloo on CPU)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def torchrun():
    """torchrun(nproc, worker, *args, timeout=...): runs workers/<worker> on nproc ranks
    (or the module M for a worker "-m M").

    Fails the test with every rank's output when a rank fails or the job outlives `timeout`
    (a hung rank fails the test instead of CI).
    """

    def run(nproc: int, worker: str, *args: str, timeout: float = 240) -> str:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               *(worker.split() if worker.startswith("-m ") else [str(WORKERS / worker)]),
               *map(str, args)]
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
                   PYTHONPATH=str(WORKERS))
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{worker} on {nproc} ranks timed out after {timeout} s:\n"
                        f"{e.stdout or ''}\n{e.stderr or ''}")
        if p.returncode != 0:
            pytest.fail(f"{worker} on {nproc} ranks failed ({p.returncode}):\n"
                        f"{p.stdout}\n{p.stderr}")
        return p.stdout

    return run


@pytest.fixture
def dcp_cli() -> str:
    """The dcp CLI installed with the package (beside the interpreter)."""
    path = Path(sys.executable).parent / "dcp"
    if not path.exists():
        pytest.fail(f"the dcp CLI is not installed at {path}")
    return str(path)
