"""Non-tensor values (step counters, hyper-parameters, RNG states, ...) as typed bytes entries.

Never pickle by default: loading a checkpoint must not run code from it. A value is stored as
JSON with type tags, so it comes back with its type: int, float (nan and infinities
included), bool, str, None, bytes, bytearray, list vs tuple, dicts with any encodable keys
(their types kept), sets, complex numbers, io.BytesIO, torch.Size, torch.dtype, torch.device,
numpy scalars and arrays, and any nesting of these. Python's json writes finite floats with
repr, so they round-trip exactly. Anything else is refused at save, naming the entry, unless
the caller opts in to pickling (`allow_pickle=True`, needed again at load: a trust decision).

Layout: the prefix `_MAGIC`, then one JSON node; or, when the node holds no tag, the plain
JSON alone. A node is a JSON null, bool, int, string or
array (a list), or an object {"$": tag, ...} for every other type. Values saved by earlier
versions are untagged JSON (no prefix) and still load.
"""

import base64
import io
import json
import math
import pickle
import sys
from typing import Any, Callable

from ._errors import DcpError, invalid_argument

_MAGIC = b"hyperdcp-value/1\n"


class _Refused(Exception):
    """A value of a type the encoding does not take; `what` names it and where it sits."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def _type_name(obj: Any) -> str:
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _numpy_node(obj: Any, np: Any) -> dict:
    dtype = obj.dtype
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise _Refused(f"a numpy value of dtype {dtype}")
    if isinstance(obj, np.ndarray):
        return {"$": "np.ndarray", "dtype": dtype.str, "shape": list(obj.shape),
                "v": _b64(np.ascontiguousarray(obj).tobytes())}
    return {"$": "np.scalar", "dtype": dtype.str, "v": _b64(obj.tobytes())}


def _torch_node(obj: Any, torch: Any) -> Any:
    """The node of a torch value, or None when `obj` is no torch value the encoding takes."""
    if isinstance(obj, torch.Size):
        return {"$": "torch.Size", "v": [int(d) for d in obj]}
    if isinstance(obj, torch.dtype):
        return {"$": "torch.dtype", "v": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"$": "torch.device", "v": str(obj)}
    if isinstance(obj, torch.Tensor):
        raise _Refused("a tensor inside a non-tensor value (only dicts, lists and tuples "
                       "around tensors are walked)")
    return None


def _encode_node(obj: Any, pickle_ok: bool) -> Any:
    t = type(obj)
    if obj is None or t in (bool, str):
        return obj
    if t is int:
        return obj
    if t is float:
        return obj if math.isfinite(obj) else {"$": "float", "v": repr(obj)}
    if t is list:
        return [_encode_node(v, pickle_ok) for v in obj]
    if t is tuple:
        return {"$": "tuple", "v": [_encode_node(v, pickle_ok) for v in obj]}
    if t is dict:
        return {"$": "dict",
                "v": [[_encode_node(k, pickle_ok), _encode_node(v, pickle_ok)]
                      for k, v in obj.items()]}
    if t is bytes:
        return {"$": "bytes", "v": _b64(obj)}
    if t is bytearray:
        return {"$": "bytearray", "v": _b64(bytes(obj))}
    if t in (set, frozenset):
        # Sorted by encoding: the bytes must not depend on this process's hash seed (ranks
        # compare them, and a checkpoint should not change with PYTHONHASHSEED).
        items = sorted((_encode_node(v, pickle_ok) for v in obj),
                       key=lambda n: json.dumps(n, sort_keys=True))
        return {"$": t.__name__, "v": items}
    if t is complex:
        return {"$": "complex", "v": [repr(obj.real), repr(obj.imag)]}
    if t is io.BytesIO:
        return {"$": "io.BytesIO", "v": _b64(obj.getvalue()), "pos": obj.tell()}
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, (np.ndarray, np.generic)):
        return _numpy_node(obj, np)
    torch = sys.modules.get("torch")
    if torch is not None:
        node = _torch_node(obj, torch)
        if node is not None:
            return node
    if pickle_ok:
        return {"$": "pickle", "v": _b64(pickle.dumps(obj, protocol=4))}
    raise _Refused(f"a value of type {_type_name(obj)}")


def encode_node(value: Any) -> Any:
    """The JSON node of a value the encoding takes without pickling (a dict key of a path)."""
    return _encode_node(value, False)


def decode_node(fqn: str, node: Any) -> Any:
    return _decoder(fqn, False)(node)


def encode(fqn: str, value: Any, allow_pickle: bool = False) -> bytes:
    """The stored bytes of the value `value` of entry `fqn`."""
    try:
        node = _encode_node(value, allow_pickle)
    except _Refused as e:
        raise invalid_argument(
            f"'{fqn}' holds {e.what}, which hyperdcp does not store without pickling: "
            "store it as plain data (ints, floats, str, bytes, lists, tuples, dicts, numpy "
            "arrays), or pass allow_pickle=True to save and load if you trust whoever loads "
            "the checkpoint (and loading runs code from it)") from None
    except RecursionError:
        raise invalid_argument(f"'{fqn}' holds a value nested too deeply (or a cycle)") from None
    text = json.dumps(node, separators=(",", ":"), allow_nan=False).encode()
    # Plain JSON when nothing needed a tag (ints, finite floats, str, bool, None and lists of
    # them decode to themselves): compact, and readable by versions before typed values.
    return _MAGIC + text if _tagged(node) else text


def _tagged(node: Any) -> bool:
    if isinstance(node, dict):
        return True
    return isinstance(node, list) and any(_tagged(n) for n in node)


def _decoder(fqn: str, pickle_ok: bool) -> Callable[[Any], Any]:
    def bad(why: str) -> Exception:
        return invalid_argument(f"'{fqn}': stored value is malformed ({why})")

    def node(n: Any) -> Any:
        if n is None or isinstance(n, (bool, int, float, str)):
            return n
        if isinstance(n, list):
            return [node(v) for v in n]
        if not isinstance(n, dict) or "$" not in n:
            raise bad("an untagged object")
        tag, v = n["$"], n.get("v")
        if tag == "tuple":
            return tuple(node(x) for x in v)
        if tag == "dict":
            return {node(k): node(x) for k, x in v}
        if tag == "float":
            return float(v)
        if tag == "bytes":
            return base64.b64decode(v)
        if tag == "bytearray":
            return bytearray(base64.b64decode(v))
        if tag == "set":
            return {node(x) for x in v}
        if tag == "frozenset":
            return frozenset(node(x) for x in v)
        if tag == "complex":
            return complex(float(v[0]), float(v[1]))
        if tag == "io.BytesIO":
            b = io.BytesIO(base64.b64decode(v))
            b.seek(n.get("pos", 0))
            return b
        if tag in ("np.ndarray", "np.scalar"):
            import numpy as np

            dtype = np.dtype(n["dtype"])
            if dtype.hasobject:
                raise bad("a numpy object dtype")
            flat = np.frombuffer(base64.b64decode(v), dtype=dtype)
            if tag == "np.scalar":
                return flat[0]
            return flat.reshape(n["shape"]).copy()  # writable, owning its memory
        if tag in ("torch.Size", "torch.dtype", "torch.device"):
            import torch

            if tag == "torch.Size":
                return torch.Size(v)
            if tag == "torch.device":
                return torch.device(v)
            dtype = getattr(torch, v, None)
            if not isinstance(dtype, torch.dtype):
                raise bad(f"unknown torch dtype {v!r}")
            return dtype
        if tag == "pickle":
            if not pickle_ok:
                raise invalid_argument(
                    f"'{fqn}' was saved pickled (allow_pickle=True); loading it runs code "
                    "from the checkpoint: pass allow_pickle=True to load if you trust it")
            return pickle.loads(base64.b64decode(v))
        raise bad(f"unknown type tag {tag!r}; saved by a newer hyperdcp?")

    return node


def decode(fqn: str, data: bytes, allow_pickle: bool = False) -> Any:
    """The value of entry `fqn` from its stored bytes."""
    if not data.startswith(_MAGIC):
        # Untagged JSON, as written before typed values; else opaque bytes, as the C++ API
        # writes them (`StateDict::add_bytes`): only their writer knows their meaning.
        try:
            return json.loads(data)
        except ValueError:  # UnicodeDecodeError included
            return bytes(data)
        except RecursionError:
            raise invalid_argument(f"'{fqn}': stored value is nested deeper than Python "
                                   "can build: damaged or hostile") from None
    try:
        tree = json.loads(data[len(_MAGIC):])
        return _decoder(fqn, allow_pickle)(tree)
    except DcpError:
        raise
    except Exception as e:
        # Whatever a damaged or hostile node makes a builder raise (ValueError, TypeError,
        # OverflowError, torch's RuntimeError, RecursionError when nested deeper than Python
        # can build, ...) is one error naming the entry.
        raise invalid_argument(f"'{fqn}': stored value is malformed "
                               f"({type(e).__name__}: {e})") from None
