"""Fuzzing the encodings a checkpoint carries into Python: typed values (_values) and entry
paths (_paths). Seeded mutations of real encodings -- bytes flipped, inserted, cut; JSON nodes
replaced by hostile ones (huge or negative numbers, infinities, deep nesting, wrong types,
unknown and swapped tags) -- must decode or fail with one DcpError naming the entry: never
another exception, a hang, or a huge allocation. Deterministic (fixed seeds), a few seconds."""

import copy
import io
import json
import random

import numpy as np
import pytest
import torch

import hyperdcp as dcp
from hyperdcp import _paths, _values

ITERATIONS = 4000

VALUES = [
    7, -1.5, float("nan"), "text", None, True, b"\x00\xff", bytearray(b"ab"), [1, [2, 3]],
    (1, "a"), {"lr": 0.1, 3: "three", (1, 2): [None]}, {1, 2}, frozenset({"x"}), 2 + 3j,
    io.BytesIO(b"abc"), np.arange(6, dtype=np.float32).reshape(2, 3), np.int64(5),
    torch.Size([2, 3]), torch.bfloat16, torch.device("cpu"),
    {"rng": {"state": np.zeros(4, dtype=np.uint8), "pos": 3}},
]
PATHS = [(("model", "layers", 3, "weight"), "ddld"), ((1, "a", 0), "dtl"),
         (((1, 2), "k"), "dd"), ((True, None, 2.5), "ddd")]

HOSTILE = [10**30, -10**30, -1, 0, 2**63, float("inf"), float("-inf"), float("nan"), "",
           "x" * 1000, [], {}, [[[[[]]]]], {"$": "nope"}, {"$": "tuple", "v": 5},
           {"$": "dict", "v": [[[1], 2]]}, {"$": "np.ndarray", "dtype": "O", "v": "", "shape": [1]},
           {"$": "np.ndarray", "dtype": "f4", "v": "AAAA", "shape": [10**12]},
           {"$": "np.scalar", "dtype": "V0", "v": ""}, {"$": "np.ndarray", "dtype": {"a": 1}},
           {"$": "torch.device", "v": "warp-drive:9"}, {"$": "torch.Size", "v": [-5, "a"]},
           {"$": "torch.dtype", "v": "__class__"}, {"$": "io.BytesIO", "v": "", "pos": 10**30},
           {"$": "io.BytesIO", "v": "", "pos": -4}, {"$": "complex", "v": ["a"]},
           {"$": "bytes", "v": "!!not base64!!"}, {"$": "set", "v": [[1]]},
           {"$": "i", "v": float("inf")}, {"$": "t", "v": "9" * 5000}, {"$": "i"},
           {"$": "pickle", "v": "gASVAAAAAAAAAAAu"}]
TAGS = ["tuple", "dict", "float", "bytes", "bytearray", "set", "frozenset", "complex",
        "io.BytesIO", "np.ndarray", "np.scalar", "torch.Size", "torch.dtype", "torch.device",
        "pickle", "i", "t", "unknown"]


def nodes(tree):
    """Every (container, key) slot of a JSON tree."""
    out = []
    stack = [tree]
    while stack:
        n = stack.pop()
        items = n.items() if isinstance(n, dict) else enumerate(n) if isinstance(n, list) else []
        for k, v in items:
            out.append((n, k))
            stack.append(v)
    return out


def mutate_tree(text: bytes, rng: random.Random) -> bytes:
    tree = json.loads(text)
    if not isinstance(tree, (dict, list)):
        tree = [tree]
    for _ in range(rng.randint(1, 3)):
        slots = nodes(tree)
        if not slots:
            break
        parent, key = rng.choice(slots)
        roll = rng.random()
        if roll < 0.6:
            parent[key] = copy.deepcopy(rng.choice(HOSTILE))
        elif roll < 0.8 and isinstance(parent, dict) and key == "$":
            parent[key] = rng.choice(TAGS)
        else:  # nesting deeper than Python's JSON can build, spliced in as text
            parent[key] = f"__deep_{rng.choice([10, 100, 5000])}__"
    text = json.dumps(tree)
    for depth in (10, 100, 5000):
        text = text.replace(f'"__deep_{depth}__"', "[" * depth + "]" * depth)
    return text.encode()


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        at = rng.randrange(len(b) + 1)
        if op < 0.4 and b:
            b[min(at, len(b) - 1)] = rng.randrange(256)
        elif op < 0.7:
            b[at:at] = bytes(rng.choice([b"[", b"]", b"{", b"}", b'"', b",", b"-", b"9e999",
                                         b"Infinity", b"NaN", b"\\u0000", b"\xff"]))
        else:
            del b[at:at + rng.randint(1, 8)]
    return bytes(b)


def must_decode_or_fail_cleanly(decode, data: bytes):
    try:
        decode(data)
    except dcp.DcpError as e:
        assert "'w'" in str(e) or "path" in str(e), str(e)


@pytest.mark.parametrize("allow_pickle", [False, True])
def test_values_decode_or_fail_with_one_error(allow_pickle):
    rng = random.Random(1234 + allow_pickle)
    seeds = [_values.encode("w", v) for v in VALUES]
    for v in VALUES:  # each one decodes to itself first
        back = _values.decode("w", _values.encode("w", v))
        assert type(back) is type(v), (v, back)
    for i in range(ITERATIONS):
        data = rng.choice(seeds)
        magic, body = (data[:len(_values._MAGIC)], data[len(_values._MAGIC):]) \
            if data.startswith(_values._MAGIC) else (b"", data)
        body = mutate_tree(body, rng) if i % 2 else mutate_bytes(body, rng)
        must_decode_or_fail_cleanly(lambda d: _values.decode("w", d, allow_pickle), magic + body)


def test_paths_decode_and_nest_or_fail_with_one_error():
    rng = random.Random(99)
    seeds = [_paths.encode(p, k) for p, k in PATHS]
    assert all(seeds)

    def decode_and_nest(data):
        decoded = _paths.decode("w", data)
        _paths.nest([(decoded, 1)], stored=1)

    for i in range(ITERATIONS):
        data = rng.choice(seeds)
        data = mutate_tree(data, rng) if i % 2 else mutate_bytes(data, rng)
        must_decode_or_fail_cleanly(decode_and_nest, data)
