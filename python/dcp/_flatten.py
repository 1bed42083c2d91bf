"""Nested state dicts <-> flat `fqn -> leaf` maps (names joined with '.', as the seed does)."""

from collections.abc import Mapping
from typing import Any, Callable, Dict

from ._errors import invalid_argument


def _join(prefix: str, key: Any) -> str:
    if not isinstance(key, (str, int)) or isinstance(key, bool):
        raise invalid_argument(
            f"state dict key {key!r} under '{prefix}' is a {type(key).__name__}; "
            "keys must be str or int")
    return f"{prefix}.{key}" if prefix else str(key)


def flatten(state_dict: Mapping, is_leaf: Callable[[Any], bool]) -> Dict[str, Any]:
    """Every leaf of `state_dict` by its dotted name, in traversal order.

    Dicts, lists and tuples are containers unless `is_leaf` says otherwise (tensors); empty
    containers hold no leaves. Two paths with the same dotted name are an error.
    """
    if not isinstance(state_dict, Mapping):
        raise invalid_argument(
            f"state_dict must be a dict, not {type(state_dict).__name__}")
    flat: Dict[str, Any] = {}

    def walk(obj: Any, prefix: str) -> None:
        if is_leaf(obj):
            pass
        elif isinstance(obj, Mapping):
            for k, v in obj.items():
                walk(v, _join(prefix, k))
            return
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, _join(prefix, i))
            return
        if prefix in flat:
            raise invalid_argument(f"two state dict entries are both named '{prefix}'")
        flat[prefix] = obj

    walk(state_dict, "")
    return flat


def replace_leaves(state_dict: dict, new_values: Dict[str, Any]) -> None:
    """Sets the leaves named in `new_values` inside `state_dict`, in place.

    Dicts and lists are updated in place; tuples (immutable) are rebuilt.
    """
    if not new_values:
        return

    def rebuild(obj: Any, prefix: str) -> Any:
        if prefix in new_values:
            return new_values[prefix]
        if isinstance(obj, dict):
            for k, v in obj.items():
                nv = rebuild(v, _join(prefix, k))
                if nv is not v:
                    obj[k] = nv
            return obj
        if isinstance(obj, list):
            for i, v in enumerate(obj):
                nv = rebuild(v, _join(prefix, i))
                if nv is not v:
                    obj[i] = nv
            return obj
        if isinstance(obj, tuple):
            items = [rebuild(v, _join(prefix, i)) for i, v in enumerate(obj)]
            if all(a is b for a, b in zip(items, obj)):
                return obj
            return obj._make(items) if hasattr(obj, "_make") else tuple(items)
        return obj

    for k, v in state_dict.items():
        nv = rebuild(v, _join("", k))
        if nv is not v:
            state_dict[k] = nv
