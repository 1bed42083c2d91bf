"""torch.distributed.checkpoint's keywords, translated: storage writers and readers give a
directory, the default planners give their options; anything else is refused by name."""

import os
from typing import Any, Optional, Tuple

from ._errors import invalid_argument


def _class_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _is_torch(obj: Any, names: Tuple[str, ...]) -> bool:
    """Whether obj is exactly one of torch DCP's classes `names` (never a subclass: a
    subclass may override what it does, which hyperdcp would silently skip)."""
    t = type(obj)
    return t.__module__.startswith("torch.distributed.checkpoint") and t.__name__ in names


def _directory(storage: Any, checkpoint_id: Any, role: str, classes: Tuple[str, ...]) -> str:
    if storage is not None and not _is_torch(storage, classes):
        raise invalid_argument(
            f"{role}={_class_name(storage)} is not supported: hyperdcp writes and reads its "
            f"own format on a file system; pass checkpoint_id=PATH (or a {classes[0]})")
    if checkpoint_id is not None:  # torch: checkpoint_id resets the storage's path
        return os.fspath(checkpoint_id)
    if storage is not None:
        return os.fspath(storage.path)
    raise invalid_argument("no checkpoint directory: pass checkpoint_id (a path) or "
                           f"{role}=FileSystem{'Writer' if 'writer' in role else 'Reader'}(path)")


def save_target(checkpoint_id: Any, storage_writer: Any, planner: Any) -> Tuple[str, bool]:
    """(directory, overwrite) of a save called with torch's keywords."""
    directory = _directory(storage_writer, checkpoint_id, "storage_writer",
                           ("FileSystemWriter", "_FileSystemWriter"))
    if planner is not None and not _is_torch(planner, ("DefaultSavePlanner",)):
        raise invalid_argument(
            f"planner={_class_name(planner)} is not supported: hyperdcp plans saves itself "
            "(replicas written once, byte-balanced writers); drop the planner argument")
    overwrite = bool(getattr(storage_writer, "overwrite", True))
    return directory, overwrite


def load_source(checkpoint_id: Any, storage_reader: Any, planner: Any,
                allow_partial: Optional[bool]) -> Tuple[str, bool]:
    """(directory, allow_partial) of a load called with torch's keywords."""
    directory = _directory(storage_reader, checkpoint_id, "storage_reader",
                           ("FileSystemReader",))
    partial = bool(allow_partial)
    if planner is not None:
        if not _is_torch(planner, ("DefaultLoadPlanner",)):
            raise invalid_argument(
                f"planner={_class_name(planner)} is not supported: hyperdcp plans loads itself "
                "(any layout, read once and broadcast); drop the planner argument, or pass "
                "DefaultLoadPlanner(allow_partial_load=True) / allow_partial=True")
        partial = partial or bool(getattr(planner, "allow_partial_load", False))
    return directory, partial
