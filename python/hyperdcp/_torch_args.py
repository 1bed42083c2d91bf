"""torch.distributed.checkpoint's keywords, translated: what hyperdcp serves (a directory or
an s3:// prefix, with the options that apply), and what it hands to torch's own implementation
(a Delegate naming why): writers, readers, planners and stagers whose behaviour it cannot
honour. Nothing torch accepts is refused."""

import os
import re
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

from ._errors import invalid_argument

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class Delegate:
    """The call goes to torch's own implementation, for this reason (logged once per reason)."""

    reason: str


def _class_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _is_torch(obj: Any, names: Tuple[str, ...]) -> bool:
    """Whether obj is exactly one of torch DCP's classes `names` (never a subclass: a
    subclass may override what it does, which hyperdcp would silently skip)."""
    t = type(obj)
    return t.__module__.startswith("torch.distributed.checkpoint") and t.__name__ in names


def _is_s3_connector(obj: Any, names: Tuple[str, ...]) -> bool:
    """s3torchconnector's DCP writer or reader (its own classes, not subclasses)."""
    t = type(obj)
    return t.__module__.startswith("s3torchconnector") and t.__name__ in names


def _fsspec_serves(scheme: str) -> bool:
    """Whether torch's fsspec storage can reach `scheme` here (gcsfs, adlfs, ... installed)."""
    try:
        import fsspec

        fsspec.get_filesystem_class(scheme)
        return True
    except Exception:
        return False


def location(checkpoint_id: Any) -> Union[str, Delegate]:
    """A checkpoint id as hyperdcp addresses it: a local path, file:// URL or s3:// prefix;
    another URL scheme goes to torch (its fsspec storage) when fsspec serves it here, and is
    one clear error otherwise (never a local directory named "gs:")."""
    path = os.fspath(checkpoint_id)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    m = _URL.match(path)
    if m is None:
        return path
    scheme = m.group(1).lower()
    if scheme == "s3":
        return path
    if scheme == "file":
        return path[len("file://"):]
    if _fsspec_serves(scheme):
        return Delegate(f"checkpoint_id {path!r}: hyperdcp serves local paths and s3://; "
                        f"{scheme}:// goes to torch's fsspec storage")
    raise invalid_argument(
        f"checkpoint_id {path!r}: the URL scheme {scheme}:// is not supported (hyperdcp "
        "serves local paths, file:// and s3://; torch's fsspec storage has no "
        f"implementation of {scheme}:// installed here)")


def _storage(storage: Any, checkpoint_id: Any, role: str,
             classes: Tuple[str, ...], s3_classes: Tuple[str, ...]) -> Union[str, Delegate]:
    served = storage is None or _is_torch(storage, classes) or \
        _is_s3_connector(storage, s3_classes)
    if not served:
        return Delegate(f"{role}={_class_name(storage)} is not one hyperdcp serves")
    if checkpoint_id is not None:  # torch: checkpoint_id resets the storage's path
        return location(checkpoint_id)
    if storage is not None:
        return location(storage.path)
    kind = "Writer" if "writer" in role else "Reader"
    raise invalid_argument(
        f"no checkpoint directory: pass checkpoint_id (a path) or {role}=FileSystem{kind}(path)")


@dataclass(frozen=True)
class HfTarget:
    """A save in the layout of torch's HuggingFaceStorageWriter, served by the engine."""

    directory: str  # the writer's path: where the shards (or a full state dict's files) go
    fqn_to_index: Tuple[Tuple[str, int], ...]  # empty: every tensor in file 1
    save_distributed: bool
    consolidate_into: str  # "": no consolidation


def _hf_target(checkpoint_id: Any, writer: Any, planner: Any) -> Union[HfTarget, Delegate]:
    if planner is not None and not _is_torch(planner, ("DefaultSavePlanner",)):
        return Delegate(f"planner={_class_name(planner)} may plan differently from hyperdcp")
    # torch: checkpoint_id resets the writer's path (the consolidation target stays).
    where = location(checkpoint_id if checkpoint_id is not None else writer.path)
    if isinstance(where, Delegate) or where.startswith("s3://"):
        return Delegate("HuggingFaceStorageWriter: hyperdcp writes safetensors to local paths")
    distributed = bool(getattr(writer, "save_distributed", False))
    consolidate = getattr(writer, "consolidated_output_path", None) \
        if getattr(writer, "enable_consolidation", False) and distributed else None
    mapping = getattr(writer, "fqn_to_index_mapping", None) or {}
    return HfTarget(where, tuple((str(k), int(v)) for k, v in mapping.items()), distributed,
                    os.fspath(consolidate) if consolidate is not None else "")


def save_target(checkpoint_id: Any, storage_writer: Any,
                planner: Any) -> Union[Tuple[str, bool], HfTarget, Delegate]:
    """(directory, overwrite) of a save called with torch's keywords, an HfTarget for torch's
    HuggingFaceStorageWriter, or a Delegate."""
    if _is_torch(storage_writer, ("HuggingFaceStorageWriter",)):
        return _hf_target(checkpoint_id, storage_writer, planner)
    where = _storage(storage_writer, checkpoint_id, "storage_writer",
                     ("FileSystemWriter", "_FileSystemWriter"), ("S3StorageWriter",))
    if isinstance(where, Delegate):
        return where
    transforms = getattr(storage_writer, "transforms", None)
    if getattr(transforms, "extensions", ()):  # compression hyperdcp would silently skip
        return Delegate("FileSystemWriter(_extensions=...) transforms torch's stream format")
    if planner is not None and not _is_torch(planner, ("DefaultSavePlanner",)):
        return Delegate(f"planner={_class_name(planner)} may plan differently from hyperdcp")
    return where, bool(getattr(storage_writer, "overwrite", True))


def load_source(checkpoint_id: Any, storage_reader: Any, planner: Any,
                allow_partial: Optional[bool]) -> Union[Tuple[str, bool], Delegate]:
    """(directory, allow_partial) of a load called with torch's keywords, or a Delegate."""
    where = _storage(storage_reader, checkpoint_id, "storage_reader",
                     ("FileSystemReader", "HuggingFaceStorageReader"), ("S3StorageReader",))
    if isinstance(where, Delegate):
        return where
    partial = bool(allow_partial)
    if planner is not None:
        if not _is_torch(planner, ("DefaultLoadPlanner",)):
            return Delegate(f"planner={_class_name(planner)} may plan differently from hyperdcp")
        partial = partial or bool(getattr(planner, "allow_partial_load", False))
    return where, partial


def staging(async_stager: Any) -> Union[bool, Delegate]:
    """Whether torch would answer an async save with an AsyncSaveResponse (a DefaultStager
    with use_async_staging), or a Delegate for a stager hyperdcp does not serve. hyperdcp
    stages into its own reused pool whatever the options (pinned memory, shared memory,
    non-blocking copies); the caller keeps owning (and closes) the stager it passed."""
    if async_stager is None:
        return False
    if not _is_torch(async_stager, ("DefaultStager",)):
        return Delegate(f"async_stager={_class_name(async_stager)} is not one hyperdcp serves")
    options = getattr(async_stager, "_config", None)
    return bool(getattr(options, "use_async_staging", True))
