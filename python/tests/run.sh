#!/usr/bin/env bash
# `make test`'s Python step: builds the package into a virtual environment with torch from
# PyPI and runs its pytest suite (torchrun jobs included).
#   run.sh VENV_DIR BUILD_DIR
# VENV_DIR is created once and reused; BUILD_DIR is scikit-build-core's build directory, kept
# so that rebuilds are incremental. Exits 77 (skip) only when PyPI cannot be reached.
set -euo pipefail

venv=$1
build_dir=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
# moto[server]: the S3 server the object-storage tests start (test_s3.py); it brings boto3.
# s3fs: torch DCP's own path to S3 (fsspec), raced against dcp by the Python benchmark.
# safetensors: the reference reader of dcp's HuggingFace exports (test_incremental.py).
deps=(torch numpy pytest "scikit-build-core>=0.10" "pybind11>=2.13" "moto[server]" s3fs
      safetensors)

if ! "$venv/bin/python" -c "import torch, numpy, pytest, scikit_build_core, pybind11, moto, s3fs, safetensors" 2>/dev/null; then
  if ! python3 -c "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/pip/', timeout=15)" 2>/dev/null; then
    echo "python.package: PyPI is unreachable, cannot install torch: skipped"
    exit 77
  fi
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "${deps[@]}"
fi

# The training frameworks whose checkpoint code test_frameworks.py runs on hyperdcp (installed
# once; none of these commands changes torch). accelerate and lightning with their deps.
# torchtitan and torchtune pin packages this torch does not need (wandb, tensorboard, torchdata,
# datasets<4.8, ...): installed --no-deps, after what their checkpoint modules import. torchtune
# 0.6.1 imports torchao.dtypes.nf4tensor and torchao.quantization.int4_weight_only, which
# torchao 0.16+ removed: torchao 0.15.0 (its pure-Python part runs on any torch).
# s3torchconnector: the ecosystem's S3 plugin for DCP (its writer and reader are served);
# its 1.5.0 imports tenacity without requiring it.
# Without PyPI (a venv made earlier, offline now) they are not installed and their tests skip.
if ! "$venv/bin/python" -c "import accelerate, lightning.fabric, torchtitan.components.checkpoint, torchtune.training.checkpointing, s3torchconnector.dcp, transformers.distributed.checkpoint" 2>/dev/null; then
  if python3 -c "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/pip/', timeout=15)" 2>/dev/null; then
    "$venv/bin/pip" install -q accelerate==1.16.0 lightning==2.6.6 tyro einops spmd_types==0.2.3 \
      datasets omegaconf sentencepiece tiktoken tokenizers s3torchconnector==1.5.0 tenacity \
      transformers==5.25.0
    # last: pip says nothing of the requirements it was told to skip
    "$venv/bin/pip" install -q --no-deps torchtitan==0.3.0 torchtune==0.6.1 torchao==0.15.0
  else
    echo "python.package: PyPI is unreachable: the framework tests skip"
  fi
fi

# mpi4py (for the mpi4py communicator test) compiles against the system's Open MPI: installed
# once where mpicc exists (scripts/setup.sh installs it), and a failed install fails the test;
# without mpicc that test is skipped, saying why.
if command -v mpicc >/dev/null && ! "$venv/bin/python" -c "import mpi4py" 2>/dev/null; then
  "$venv/bin/pip" install -q mpi4py
fi

# The build tools are in the venv already: no isolated build environment to download.
if command -v ccache >/dev/null; then export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}; fi
"$venv/bin/pip" install -q --no-build-isolation "$src" -C build-dir="$build_dir"

cd "$src"
# -rs: every skipped test says why in the log.
exec "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider python/tests
