"""Writes the seed corpus of fuzz/checkpoint_fuzz.cc: small real checkpoints saved by hyperdcp,
each packed as the target reads its input (flags, u32 metadata length, metadata, the data
files in the metadata's order).

    build/py_venv/bin/python scripts/fuzz_seeds.py fuzz/corpus/checkpoint
"""
import os
import struct
import sys
import tempfile

import torch

import hyperdcp as dcp


def pack(ckpt: str, flags: int) -> bytes:
    meta = open(os.path.join(ckpt, "dcp.metadata"), "rb").read()
    out = bytes([flags]) + struct.pack("<I", len(meta)) + meta
    for name in dcp.read_metadata(ckpt).files:
        out += open(os.path.join(ckpt, name), "rb").read()
    return out


def main(out_dir: str) -> None:
    g = torch.Generator().manual_seed(0)
    states = {
        "mixed": {"w": torch.randn(4, 3, generator=g), "b": torch.randn(5).to(torch.bfloat16),
                  "i": torch.arange(4, dtype=torch.int64).reshape(2, 2), "step": 7,
                  "cfg": {"lr": 0.1, "name": "adam"}},
        "chunk": {"w": dcp.TensorChunk(torch.randn(4, 3, generator=g), [4, 3], [0, 0]),
                  "s": torch.tensor(3.5), "long": torch.randn(300, generator=g),
                  "opt": {"state": {0: {"m": torch.ones(3)}}, "betas": [0.9, 0.99]}},
        "empty": {"e": torch.zeros(0, 4), "u8": torch.arange(9, dtype=torch.uint8)},
    }
    os.makedirs(out_dir, exist_ok=True)
    for name, sd in states.items():
        with tempfile.TemporaryDirectory() as d:
            dcp.save(sd, d, no_dist=True)
            for flags in (0, 2):  # as saved; with allow_partial
                with open(os.path.join(out_dir, f"{name}-{flags}"), "wb") as f:
                    f.write(pack(d, flags))


if __name__ == "__main__":
    main(sys.argv[1])
