#!/usr/bin/env python3
"""Writes one safetensors file of N tiny tensors (issue 11 item 8: time `dcp convert` on it).

    python3 tests/hf_interop/make_many_tensors.py /tmp/many.safetensors 200000
    time dcp convert --quiet /tmp/many.safetensors /tmp/many-dcp
    time dcp convert --quiet /tmp/many-dcp /tmp/many-hf --to hf

Standard library only: tensor i is "model.t{i}.weight", F32 of shape [1] holding float(i).
"""
import json
import struct
import sys


def main():
    path, n = sys.argv[1], int(sys.argv[2])
    header = {"__metadata__": {"format": "pt"}}
    for i in range(n):
        header[f"model.t{i}.weight"] = {"dtype": "F32", "shape": [1],
                                        "data_offsets": [4 * i, 4 * i + 4]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(b"".join(struct.pack("<f", float(i)) for i in range(n)))


if __name__ == "__main__":
    main()
