"""Nested state dicts <-> flat `fqn -> leaf` maps, with torch.distributed.checkpoint's meaning.

As torch's flatten_state_dict: dicts are walked (keys turned into names with str()); a list
is walked only when it holds a tensor, a dict or a walked list, otherwise it is ONE value,
stored whole and replaced whole on load whatever the template's list holds; tuples and every
other non-tensor are one value. Where torch would pickle tensors (a tuple holding tensors),
the tuple is walked like a list instead. Only torch tensors decide that a list or tuple is
walked (numpy arrays inside one are part of the value, as in numpy's RNG state), while a
numpy array reached by the walk (a dict's entry) is stored as a tensor. Names join the path's
keys with '.', as torch does.

Each leaf keeps its path (the real keys: a dict's own key objects, list indices), so that a
load writes a value back under the template's key, whatever its type.
"""

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, NamedTuple, Set, Tuple

from ._errors import invalid_argument

Path = Tuple[Any, ...]
_PLAIN_DICTS = (dict, OrderedDict)  # whose values() and iteration are the built-in ones


class Flat(NamedTuple):
    leaves: Dict[str, Any]  # fqn -> tensor or value, in traversal order
    paths: Dict[str, Path]  # fqn -> the keys that lead to it
    aliased: Set[int]  # ids of containers reached by more than one path
    tensors: List[Any]  # the tensor leaves, in order (the others are values)
    values: List[str]  # fqns of the non-tensor leaves, in order
    kinds: Dict[str, str]  # fqn -> the container of each key of its path: d(ict), l(ist), t(uple)


def _holds_tensor(obj: Any, walks: Callable[[Any], bool]) -> bool:
    if walks(obj):
        return True
    if isinstance(obj, Mapping):
        return any(_holds_tensor(v, walks) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds_tensor(v, walks) for v in obj)
    return False


def is_walked(obj: Any, walks: Callable[[Any], bool]) -> bool:
    """Whether a container is walked entry by entry (else it is one value); `walks` tells
    the tensors whose presence makes a list or tuple walked."""
    if isinstance(obj, Mapping):
        return True
    if isinstance(obj, list):  # torch's _is_terminal, negated
        return any(walks(v) or isinstance(v, Mapping) or
                   (isinstance(v, (list, tuple)) and is_walked(v, walks)) for v in obj)
    if isinstance(obj, tuple):  # torch pickles these whole; we never pickle tensors
        return _holds_tensor(obj, walks)
    return False


def flatten(state_dict: Mapping, is_tensor_type: Callable[[type], bool],
            walks: Callable[[Any], bool]) -> Flat:
    """Every leaf of `state_dict` by its dotted name. Two paths with one name are an error."""
    if not isinstance(state_dict, Mapping):
        raise invalid_argument(f"state_dict must be a dict, not {type(state_dict).__name__}")
    leaves: Dict[str, Any] = {}
    paths: Dict[str, Path] = {}
    seen: Set[int] = set()
    aliased: Set[int] = set()
    tensors: List[Any] = []
    values: List[str] = []
    kinds: Dict[str, str] = {}

    def add(obj: Any, path: Path, name: str, kind: str, tensor: bool) -> None:
        if name in leaves:
            raise invalid_argument(
                f"two state dict entries are both named '{name}' (paths {paths[name]!r} and "
                f"{path!r})")
        leaves[name] = obj
        paths[name] = path
        kinds[name] = kind
        if tensor:
            tensors.append(obj)
        else:
            values.append(name)

    def walk(obj: Any, path: Path, name: str, kind: str) -> None:
        tensor = is_tensor_type(type(obj))
        if tensor or not is_walked(obj, walks):
            add(obj, path, name, kind, tensor)
            return
        if id(obj) in seen:
            aliased.add(id(obj))
        seen.add(id(obj))
        if isinstance(obj, Mapping):
            walk_dict(obj, path, name + ".", kind + "d")
        else:
            k = "t" if isinstance(obj, tuple) else "l"
            for key, v in enumerate(obj):
                walk(v, path + (key,), f"{name}.{key}", kind + k)

    def walk_dict(obj: Mapping, path: Path, prefix: str, kind: str) -> None:
        # A model's or an optimizer state's dict holds thousands of tensors under string
        # keys: each run of them is taken in one C-level pass per field (a repeated call
        # pays this per tensor); the other entries are walked one by one.
        plain = type(obj) in _PLAIN_DICTS
        if plain:
            keys, items = list(obj), list(obj.values())  # C-level, in one consistent order
        else:
            pairs = list(obj.items())  # one pass: a subclass's own iteration order holds
            keys, items = [k for k, _ in pairs], [v for _, v in pairs]
        types = list(map(type, items))
        tensor_types: Set[type] = set()
        if plain and set(map(type, keys)) == {str}:
            tensor_types = {t for t in set(types) if is_tensor_type(t)}
        start = 0
        for i in [i for i, t in enumerate(types) if t not in tensor_types]:
            add_tensors(keys[start:i], items[start:i], path, prefix, kind)
            walk(items[i], path + (keys[i],), prefix + str(keys[i]), kind)
            start = i + 1
        add_tensors(keys[start:], items[start:], path, prefix, kind)

    def add_tensors(keys: List[str], items: List[Any], path: Path, prefix: str,
                    kind: str) -> None:
        names = list(map(prefix.__add__, keys)) if prefix else keys
        if not leaves.keys().isdisjoint(names):  # a name taken: the error names both paths
            for key, name, item in zip(keys, names, items):
                add(item, path + (key,), name, kind, True)
            return
        leaves.update(zip(names, items))
        paths.update(zip(names, map(path.__add__, zip(keys))))
        kinds.update(dict.fromkeys(names, kind))
        tensors.extend(items)

    walk_dict(state_dict, (), "", "d")
    return Flat(leaves, paths, aliased, tensors, values, kinds)


def _set(obj: Any, path: Path, value: Any, aliased: Set[int]) -> Any:
    """`obj` with the entry at `path` set to `value`: in place, except that a tuple is
    rebuilt and a container the template shares between entries is copied first (the load
    of one entry must not show through another)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(obj, tuple):
        items = list(obj)
        items[key] = _set(items[key], rest, value, aliased)
        return type(obj)(items) if type(obj) is tuple else obj._make(items)
    if id(obj) in aliased:
        obj = dict(obj) if isinstance(obj, dict) else list(obj) if isinstance(obj, list) \
            else obj.copy()
    child = obj[key]
    new = _set(child, rest, value, aliased)
    if new is not child or not rest:
        obj[key] = new
    return obj


def set_leaves(state_dict: dict, flat: Flat, new_values: Dict[str, Any]) -> None:
    """Replaces the leaves named in `new_values` inside `state_dict` (see _set)."""
    for fqn, value in new_values.items():
        path = flat.paths[fqn]
        top = path[0]
        state_dict[top] = _set(state_dict[top], path[1:], value, flat.aliased)

