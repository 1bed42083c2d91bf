"""Reference-client side of the interop test (see run.sh). Uses only safetensors + numpy."""
import glob
import json
import os
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
          "float16", "float32", "float64"]


NUMPY_LESS = {"BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4",
              "F6_E2M3", "F6_E3M2", "C64"}


def model():
    rng = np.random.default_rng(1234)
    out = {}
    for i, dt in enumerate(DTYPES):
        shape = (3 + i, 17)
        if dt == "bool":
            a = rng.integers(0, 2, size=shape).astype(bool)
        else:
            # Random bytes reinterpreted: every bit pattern, NaN payloads included.
            a = np.frombuffer(rng.bytes(int(np.prod(shape)) * np.dtype(dt).itemsize),
                              dtype=dt).reshape(shape).copy()
        out[f"model.layers.{i}.{dt}.weight"] = a
    out["model.embed_tokens.weight"] = rng.standard_normal((300, 64)).astype(np.float32)
    out["model.norm.scalar"] = np.array(3.5, dtype=np.float64)
    out["model.empty"] = np.zeros((0, 8), dtype=np.float16)
    return out


def read_source(path):
    """Every tensor of a file, or of a directory (model.safetensors or an index)."""
    if os.path.isfile(path):
        return load_file(path), None
    index_path = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        return load_file(os.path.join(path, "model.safetensors")), None
    with open(index_path) as f:
        index = json.load(f)
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        part = load_file(os.path.join(path, shard))
        for k in part:
            assert index["weight_map"][k] == shard, (k, shard)
        out.update(part)
    assert set(out) == set(index["weight_map"]), "index and shards disagree"
    total = sum(a.nbytes for a in out.values())
    assert index["metadata"]["total_size"] == total, (index["metadata"], total)
    return out, index


def compare(want_path, got_path):
    want, _ = read_source(want_path)
    got, index = read_source(got_path)
    assert set(want) == set(got), (sorted(set(want) ^ set(got)))
    for k, a in want.items():
        b = got[k]
        assert a.dtype == b.dtype and a.shape == b.shape, (k, a.dtype, b.dtype, a.shape, b.shape)
        assert a.tobytes() == b.tobytes(), f"{k}: bytes differ"
    files = ([got_path] if os.path.isfile(got_path) else
             glob.glob(os.path.join(got_path, "*.safetensors")))
    for fn in files:
        with safe_open(fn, framework="np") as f:
            assert f.metadata() == {"format": "pt"}, (fn, f.metadata())
    print(f"interop: {len(want)} tensors bitwise equal in {got_path}"
          + (f" ({len(set(index['weight_map'].values()))} shards)" if index else ""))


def open_data(dirs):
    n_files = n_tensors = 0
    for d in dirs:
        for fn in sorted(glob.glob(os.path.join(d, "data-*.safetensors"))):
            with safe_open(fn, framework="np") as f:
                for k in f.keys():
                    sl = f.get_slice(k)
                    shape, dtype = sl.get_shape(), sl.get_dtype()
                    if dtype not in NUMPY_LESS:  # numpy has no bfloat16 / float8 / float4
                        a = f.get_tensor(k)
                        assert list(a.shape) == list(shape), (fn, k, a.shape, shape)
                    n_tensors += 1
            n_files += 1
    assert n_files > 0, "no dcp data files found"
    print(f"interop: safetensors opened {n_files} dcp data files, {n_tensors} tensors")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "write":
        os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
        save_file(model(), sys.argv[2], metadata={"format": "np"})
    elif cmd == "compare":
        compare(sys.argv[2], sys.argv[3])
    elif cmd == "open-data":
        open_data(sys.argv[2:])
    else:
        sys.exit(f"unknown command {cmd}")
