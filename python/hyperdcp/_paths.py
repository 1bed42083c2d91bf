"""Where each entry sat in the saved state dict, recorded in the metadata (TensorMeta::path),
so that a checkpoint opens with its nesting: `{"model": {"net1.weight": t}}` and
`{"model": {"net1": {"weight": t}}}` share the name "model.net1.weight" but not the path.

A path is stored as JSON (the node encoding of _values, so dict keys keep their types): a
list with one node per key; a list index is {"$": "i", "v": n}, a tuple index
{"$": "t", "v": n}, and a dict key is the key's own node.
"""

import json
from typing import Any, List, Tuple

from . import _values
from ._errors import DcpError, invalid_argument

# A decoded path: (kind, key) per level, kind "d" (dict key), "l" (list index), "t" (tuple).
Decoded = List[Tuple[str, Any]]


def encode(path: Tuple[Any, ...], kinds: str) -> bytes:
    """The stored path; empty when a key has no encoding (the entry then opens by its name)."""
    nodes = []
    for key, kind in zip(path, kinds):
        if kind != "d":
            nodes.append({"$": "i" if kind == "l" else "t", "v": key})
            continue
        try:
            nodes.append(_values.encode_node(key))
        except Exception:  # a key of a type the value encoding refuses
            return b""
    return json.dumps(nodes, separators=(",", ":"), allow_nan=False).encode()


def encode_all(flat: Any) -> Tuple[List[str], List[bytes]]:
    """(fqns, paths) of every leaf of a flattened state dict."""
    fqns = list(flat.paths)
    return fqns, [encode(flat.paths[f], flat.kinds[f]) for f in fqns]


def decode(fqn: str, data: bytes) -> Decoded:
    try:
        nodes = json.loads(data)
        out: Decoded = []
        for n in nodes:
            if isinstance(n, dict) and n.get("$") in ("i", "t"):
                out.append(("l" if n["$"] == "i" else "t", int(n["v"])))
            else:
                key = _values.decode_node(fqn, n)
                hash(key)  # a dict key: a list or a dict is none
                out.append(("d", key))
        if not out:
            raise ValueError("an empty path")
        return out
    except DcpError:
        raise
    except Exception as e:  # whatever a damaged or hostile path makes the builders raise
        raise invalid_argument(f"'{fqn}': stored path is malformed "
                               f"({type(e).__name__}: {e})") from None


class _Node:
    """A container being assembled: its kind and its entries by key."""

    __slots__ = ("kind", "items")

    def __init__(self, kind: str):
        self.kind, self.items = kind, {}


def nest(entries: List[Tuple[Decoded, Any]], stored: int) -> dict:
    """The nested state dict holding each value at its path (lists and tuples in index order;
    an index no entry fills holds None). `stored`: the number of entries the checkpoint holds."""
    root = _Node("d")
    # A list position needs an entry at it or after it (empty containers store none): far
    # past the checkpoint's entries it is a damaged or hostile path, never a list to build.
    bound = 8 * stored + 1024
    for path, value in entries:
        node = root
        for level, (kind, key) in enumerate(path):
            if kind in ("l", "t") and not 0 <= key < bound:
                raise invalid_argument(f"a stored path holds position {key} of a "
                                       f"{'list' if kind == 'l' else 'tuple'} in a checkpoint "
                                       f"of {stored} entries: the path is malformed")
            if level == len(path) - 1:
                node.items[key] = value
                break
            nxt_kind = path[level + 1][0]
            child = node.items.get(key)
            if not isinstance(child, _Node):
                child = node.items[key] = _Node(nxt_kind)
            node = child

    def build(node: "_Node") -> Any:
        items = {k: build(v) if isinstance(v, _Node) else v for k, v in node.items.items()}
        if node.kind == "d":
            return items
        seq = [items.get(i) for i in range(max(items) + 1)] if items else []
        return seq if node.kind == "l" else tuple(seq)

    return build(root)
