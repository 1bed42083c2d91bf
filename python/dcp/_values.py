"""Non-tensor leaves (step counters, hyper-parameters, ...) as bytes entries.

JSON, never pickle: loading a checkpoint must not run code from it. Python's json writes
floats with repr, so they round-trip exactly, and keeps ints and bools apart from floats.
"""

import json
import sys
from typing import Any

from ._errors import invalid_argument

_SCALARS = (bool, int, float, str, type(None))


def _numpy_scalar(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.generic)


def encode(fqn: str, value: Any) -> bytes:
    if _numpy_scalar(value):
        value = value.item()
    if not isinstance(value, _SCALARS):
        raise invalid_argument(
            f"'{fqn}' is a {type(value).__module__}.{type(value).__qualname__}; a state dict "
            "may hold tensors, numpy arrays, dicts, lists and int/float/str/bool/None values")
    return json.dumps(value).encode()


def decode(fqn: str, data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError as e:
        raise invalid_argument(f"'{fqn}': stored value is not JSON ({e})") from None
