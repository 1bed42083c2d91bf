"""Tensor leaves -> chunks over host memory that the engine reads (save) or fills (load)."""

import sys
from typing import Any, Callable, List, Optional, Sequence

from ._chunk_types import HostChunk, TensorChunk
from ._errors import invalid_argument


def _is_tensor_type(t: type) -> bool:
    if issubclass(t, TensorChunk):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(t, torch.Tensor):
        return True
    np = sys.modules.get("numpy")
    return np is not None and issubclass(t, np.ndarray)


# By type: state dicts hold few types and many leaves (a type's answer cannot change, except
# that torch or numpy may be imported later: only True answers and builtins are kept).
_TENSOR_TYPES = {t: False for t in (int, float, str, bool, type(None), dict, list, tuple)}


def is_tensor_type(t: type) -> bool:
    known = _TENSOR_TYPES.get(t)
    if known is not None:
        return known
    answer = _is_tensor_type(t)
    if answer:
        _TENSOR_TYPES[t] = True
    return answer


def is_tensor(obj: Any) -> bool:
    return is_tensor_type(type(obj))


def is_torch_tensor(obj: Any) -> bool:
    """A torch tensor (DTensor, ShardedTensor included) or a TensorChunk: what makes torch
    walk a list."""
    if isinstance(obj, TensorChunk):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def host_chunks(fqn: str, value: Any, for_load: bool,
                load_as: Any = None) -> List[HostChunk]:
    """The chunks this rank holds of a tensor leaf: one, several (a ShardedTensor), or none
    (a DTensor whose mesh excludes this rank). `load_as`: a torch dtype to load through (a
    staged copy cast into the tensor afterwards, as torch DCP casts)."""
    if not isinstance(value, TensorChunk):
        np = sys.modules.get("numpy")
        if np is None or not isinstance(value, np.ndarray):
            from .torch import torch_chunks
            return torch_chunks(fqn, value, for_load, load_as)
    chunk = host_chunk(fqn, value, for_load)
    return [] if chunk is None else [chunk]


def host_chunk(fqn: str, value: Any, for_load: bool) -> Optional[HostChunk]:
    """The chunk of a tensor leaf; None for a DTensor whose mesh excludes this rank."""
    global_shape = offsets = None
    if isinstance(value, TensorChunk):
        global_shape, offsets = list(value.global_shape), list(value.offsets)
        value = value.data
        if len(global_shape) != len(offsets):
            raise invalid_argument(
                f"'{fqn}': global_shape {global_shape} and offsets {offsets} differ in rank")
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        from ._numpy import numpy_chunk
        chunk = numpy_chunk(fqn, value, for_load)
    else:
        from .torch import torch_chunk
        chunk = torch_chunk(fqn, value, for_load)
    if chunk is not None and global_shape is not None:
        if len(global_shape) != len(chunk.shape):
            raise invalid_argument(
                f"'{fqn}': a {len(chunk.shape)}-d chunk of a {len(global_shape)}-d tensor")
        chunk.global_shape, chunk.offsets = global_shape, offsets
    return chunk
