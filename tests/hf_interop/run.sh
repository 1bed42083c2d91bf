#!/usr/bin/env bash
# Interoperability with the reference safetensors client (PyPI `safetensors` + numpy):
#   (a) Python writes a HuggingFace file; dcp converts it to a dcp checkpoint and back (single
#       file and sharded with an index); Python reads the results and compares bitwise;
#   (b) Python opens dcp's own data files (a `dcp demo --dir` checkpoint and the converted one).
# The packages go into a virtual environment in the build directory, created once. Without
# network access to PyPI the test is skipped (exit 77), never failed.
#
#   run.sh DCP_CLI WORK_DIR VENV_DIR
set -euo pipefail
cli=$1
work=$2
venv=$3
here=$(cd "$(dirname "$0")" && pwd)

if ! "$venv/bin/python" -c "import safetensors.numpy, numpy" >/dev/null 2>&1; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    echo "interop: skipped: python3 -m venv is not available (python3-venv)"
    exit 77
  fi
  if ! timeout 600 "$venv/bin/pip" install --disable-pip-version-check -q --timeout 20 \
      --retries 1 safetensors numpy; then
    echo "interop: skipped: cannot install safetensors and numpy from PyPI (offline?)"
    rm -rf "$venv"
    exit 77
  fi
fi
py="$venv/bin/python"
"$py" -c "import safetensors, numpy; print('interop: safetensors', safetensors.__version__, 'numpy', numpy.__version__)"

rm -rf "$work"
mkdir -p "$work/hf"
set -x
"$py" "$here/interop.py" write "$work/hf/model.safetensors"
"$cli" convert "$work/hf/model.safetensors" "$work/dcp" --quiet
"$cli" verify "$work/dcp"
"$cli" convert "$work/dcp" "$work/back" --to hf --quiet
"$py" "$here/interop.py" compare "$work/hf/model.safetensors" "$work/back"
"$cli" convert "$work/dcp" "$work/sharded" --to hf --max-shard-size 40KB --quiet
"$py" "$here/interop.py" compare "$work/hf/model.safetensors" "$work/sharded"
# An indexed directory written by dcp converts again, and a direct load path reads it.
"$cli" convert "$work/sharded" "$work/dcp2" --quiet
"$cli" convert "$work/dcp2" "$work/back2" --to hf --quiet
"$py" "$here/interop.py" compare "$work/hf/model.safetensors" "$work/back2"
# dcp's own data files.
"$cli" demo --dir "$work/demo" --layers 1 --width-scale 0.05 >/dev/null
"$py" "$here/interop.py" open-data "$work/demo/step_100" "$work/dcp"
