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
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ._errors import invalid_argument

Path = Tuple[Any, ...]
_PLAIN_DICTS = (dict, OrderedDict)  # whose values() and iteration are the built-in ones


class Flat:
    """The leaves of a state dict by name, and where each sat. Paths and container kinds are
    kept per run of leaves (a model's dict: one run of thousands of tensors) and spelled out
    per leaf only when asked for: a repeated preparation compares the runs (`layout`)."""

    __slots__ = ("leaves", "aliased", "tensors", "values", "_runs", "_single", "_paths",
                 "_kinds")

    def __init__(self) -> None:
        self.leaves: Dict[str, Any] = {}  # fqn -> tensor or value, in traversal order
        self.aliased: Set[int] = set()  # ids of containers reached by more than one path
        self.tensors: List[Any] = []  # the tensor leaves, in order (the others are values)
        self.values: List[str] = []  # fqns of the non-tensor leaves, in order
        # In leaf order: (path, kind, keys, prefix) for leaves named prefix + key under the
        # container at `path`, or (path, kind, name) for one leaf.
        self._runs: List[tuple] = []
        self._single: Dict[str, Path] = {}  # the paths of the one-leaf runs (every value's)
        self._paths: Optional[Dict[str, Path]] = None
        self._kinds: Optional[Dict[str, str]] = None

    def layout(self) -> List[tuple]:
        """What fixes every leaf's path and kinds: equal layouts, equal paths and kinds."""
        return self._runs

    def path_of(self, fqn: str) -> Path:
        """The keys that lead to `fqn`; a value's without spelling out every leaf's path."""
        path = self._single.get(fqn)
        return path if path is not None else self.paths[fqn]

    @property
    def paths(self) -> Dict[str, Path]:
        """fqn -> the keys that lead to it."""
        if self._paths is None:
            self._spell_out()
        return self._paths  # type: ignore[return-value]

    @property
    def kinds(self) -> Dict[str, str]:
        """fqn -> the container of each key of its path: d(ict), l(ist), t(uple)."""
        if self._kinds is None:
            self._spell_out()
        return self._kinds  # type: ignore[return-value]

    def _spell_out(self) -> None:
        paths: Dict[str, Path] = {}
        kinds: Dict[str, str] = {}
        for run in self._runs:
            if len(run) == 3:
                path, kind, name = run
                paths[name] = path
                kinds[name] = kind
                continue
            path, kind, keys, prefix = run
            names = list(map(prefix.__add__, keys)) if prefix else keys
            paths.update(zip(names, map(path.__add__, zip(keys))))
            kinds.update(dict.fromkeys(names, kind))
        self._paths, self._kinds = paths, kinds


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
    flat = Flat()
    leaves, tensors, values, runs = flat.leaves, flat.tensors, flat.values, flat._runs
    seen: Set[int] = set()

    def add(obj: Any, path: Path, name: str, kind: str, tensor: bool) -> None:
        if name in leaves:  # the paths spelled out from the runs so far name the other one
            raise invalid_argument(
                f"two state dict entries are both named '{name}' (paths {flat.paths[name]!r} "
                f"and {path!r})")
        leaves[name] = obj
        runs.append((path, kind, name))
        flat._single[name] = path
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
            flat.aliased.add(id(obj))
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
        if not keys:
            return
        names = list(map(prefix.__add__, keys)) if prefix else keys
        if not leaves.keys().isdisjoint(names):  # a name taken: the error names both paths
            for key, name, item in zip(keys, names, items):
                add(item, path + (key,), name, kind, True)
            return
        leaves.update(zip(names, items))
        runs.append((path, kind, tuple(keys), prefix))
        tensors.extend(items)

    walk_dict(state_dict, (), "", "d")
    return flat


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


def set_leaves(state_dict: dict, flat: Flat, new_values: Dict[str, Any]) -> Set[Any]:
    """Replaces the leaves named in `new_values` inside `state_dict` (see _set); returns the
    top-level keys whose entries it set."""
    tops: Set[Any] = set()
    for fqn, value in new_values.items():
        path = flat.path_of(fqn)
        top = path[0]
        state_dict[top] = _set(state_dict[top], path[1:], value, flat.aliased)
        tops.add(top)
    return tops

