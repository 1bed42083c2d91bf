"""load_all: a checkpoint opened like a file, without a template (torch's
_load_state_dict_from_keys, with the nesting kept exactly)."""

import os
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ._errors import invalid_argument
from ._metadata import per_rank_value, read_metadata


def _selected(fqn: str, path: Tuple[Any, ...], keys: Optional[set]) -> bool:
    if keys is None:
        return True
    return fqn in keys or path[0] in keys or any(fqn.startswith(k + ".") for k in keys
                                                 if isinstance(k, str))


def load_all(checkpoint_id: "os.PathLike | str", *, keys: Optional[Iterable[Any]] = None,
             process_group: Any = None, no_dist: bool = False, device: Any = "cpu",
             allow_pickle: bool = False, verify_checksums: bool = True) -> Dict[str, Any]:
    """The whole checkpoint (or the entries under `keys`: names, name prefixes or top-level
    keys) as the nested state dict it was saved from, every tensor allocated whole (on
    `device`) and every value decoded. Entries saved without a path (by the C++ library, by
    earlier versions, or converted from HuggingFace) sit at the top level under their names.

    Under a process group every rank calls it and gets everything; each stored chunk is read
    once and broadcast to the ranks that need it.
    """
    import torch

    from ._api import load
    from ._paths import decode, nest
    from ._torch_dtypes import FROM_DCP

    directory = os.fspath(checkpoint_id)
    md = read_metadata(directory)
    wanted = None if keys is None else set(keys)
    flat: Dict[str, Any] = {}  # fqn -> a whole tensor to fill, or None for a value
    where: List[Tuple[str, Any]] = []  # fqn, decoded path
    for stored in list(md.tensors) + list(md.bytes):
        # A value saved per rank loads under its name (each rank its own, see load).
        variant = per_rank_value(stored) if stored in md.bytes else None
        fqn = stored if variant is None else variant[0]
        if fqn in flat:
            continue
        path = decode(stored, md.raw_paths[stored]) if stored in md.raw_paths else [("d", fqn)]
        if not _selected(fqn, tuple(k for _, k in path), wanted):
            continue
        info = md.tensors.get(fqn)
        if info is not None and info.dtype not in FROM_DCP:
            raise invalid_argument(f"'{fqn}': dtype {info.dtype} has no torch dtype here")
        flat[fqn] = None if info is None else torch.empty(info.shape,
                                                          dtype=FROM_DCP[info.dtype])
        where.append((fqn, path))
    if wanted is not None and not flat:
        raise invalid_argument(f"{directory}: no entry matches keys {sorted(map(str, wanted))}")
    # A flat template: each top-level key is a name, so it flattens to exactly that name.
    load(flat, directory, process_group=process_group, no_dist=no_dist,
         allow_pickle=allow_pickle, verify_checksums=verify_checksums)
    if device is not None and torch.device(device).type != "cpu":
        flat = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in flat.items()}
    return nest([(path, flat[fqn]) for fqn, path in where], len(md.tensors) + len(md.bytes))
