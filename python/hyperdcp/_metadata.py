"""read_metadata: what a checkpoint holds, without loading it."""

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from . import _dcp

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (offsets, lengths)


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors spelling: "BF16", "F32", ...
    shape: Tuple[int, ...]  # global shape
    chunks: Tuple[Box, ...]  # stored chunks

    @property
    def torch_dtype(self) -> Any:
        from ._torch_dtypes import FROM_DCP

        return FROM_DCP[self.dtype]


@dataclass(frozen=True)
class Metadata:
    tensors: Dict[str, TensorInfo]
    bytes: Dict[str, int]  # non-tensor entries: fqn -> stored size
    world_size: int  # ranks that saved it
    files: Dict[str, int]  # data file -> size
    save_id: int
    # fqn -> the stored path (see _paths.py), for entries saved with one.
    raw_paths: Dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def paths(self) -> Dict[str, Tuple[Any, ...]]:
        """fqn -> the keys that led to the entry in the saved state dict (typed), for entries
        saved with a path (hyperdcp's Python package records them; see load_all)."""
        from . import _paths

        return {fqn: tuple(key for _, key in _paths.decode(fqn, data))
                for fqn, data in self.raw_paths.items()}


_PER_RANK = re.compile(r"^(.+)\.__dcp_rank_(0|[1-9][0-9]*)$")


def per_rank_value(name: str) -> Optional[Tuple[str, int]]:
    """(name, rank) of a value saved per rank (it differed between the saving ranks; a load
    gives each rank its own back, src/checkpoint/rank_values.h); None for other names."""
    m = _PER_RANK.match(name)
    return None if m is None else (m.group(1), int(m.group(2)))


def read_metadata(checkpoint_id: "os.PathLike | str") -> Metadata:
    """Names, dtypes, global shapes and stored chunks of a checkpoint (dcp or HuggingFace)."""
    md = _dcp.read_metadata(os.fspath(checkpoint_id))
    tensors = {
        fqn: TensorInfo(dtype, tuple(shape),
                        tuple((tuple(o), tuple(n)) for o, n in chunks))
        for fqn, dtype, shape, chunks in md["tensors"]
    }
    return Metadata(tensors=tensors, bytes=dict(md["bytes"]), world_size=md["world_size"],
                    files=dict(md["files"]), save_id=md["save_id"], raw_paths=dict(md["paths"]))
