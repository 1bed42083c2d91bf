"""mpi4py communicators: process_group=MPI.COMM_WORLD under mpirun uses the MPI backend."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"


def test_mpi4py_comm_save_load_async_under_mpirun(tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install mpi4py)")
    import hyperdcp._comm

    # setup.sh installs Open MPI, so the package must have built its MPI plugin.
    assert os.path.exists(hyperdcp._comm.mpi_plugin_path()), "the MPI plugin was not built"
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not on PATH")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    cmd = [mpirun, "-np", "2", "--oversubscribe", sys.executable,
           str(WORKERS / "mpi_save.py"), str(tmp_path)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpirun timed out:\n{e.stdout or ''}\n{e.stderr or ''}")
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert p.stdout.count(": ok") == 2, p.stdout

    # The MPI-written checkpoint loads in one plain process (a world of one).
    import numpy as np

    import hyperdcp as dcp

    sd = {"w": np.zeros((8, 6), np.float32), "step": 0}
    dcp.load(sd, tmp_path / "sync", allow_partial=True)
    assert np.array_equal(sd["w"], np.arange(48, dtype=np.float32).reshape(8, 6))
    assert sd["step"] == 7
