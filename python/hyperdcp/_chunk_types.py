"""The chunk types: what callers hand over (TensorChunk) and what the engine reads or fills
(HostChunk). A leaf module: the tensor adapters (numpy, torch) and the dispatch in _chunks
import it."""

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence


@dataclass
class TensorChunk:
    """A plain tensor (torch or numpy) that holds one box of a larger global tensor.

    The seed's CHUNK_INFO: `data` holds the elements at `offsets` of a tensor of
    `global_shape` (data's shape gives the box's lengths). Ranks may hold different boxes
    of the same name; load fills `data` in place.
    """

    data: Any
    global_shape: Sequence[int]
    offsets: Sequence[int]


@dataclass
class HostChunk:
    """One chunk as the engine sees it: row-major host memory at `data_ptr`."""

    owner: Any  # keeps the memory alive during the engine call
    data_ptr: int
    dtype: str  # safetensors spelling, "BF16"
    shape: Sequence[int]
    global_shape: Sequence[int]
    offsets: Sequence[int]
    # Load only: copies the host memory back into the caller's tensor when `owner` is a
    # staging copy (device memory, non-contiguous tensor); None when filled in place.
    write_back: Optional[Callable[[], None]] = None
