"""torch tensors and DTensors as chunks.

A CPU tensor is a view of its own memory; a DTensor is its local shard, placed in the global
tensor where its placements put it (torch's compute_local_shape_and_global_offset, the same
function torch.distributed.checkpoint uses). Device memory and non-contiguous tensors go
through one host copy (written back after a load).
"""

from typing import Any, Dict, List, Optional, Tuple

import torch

from ._chunk_types import HostChunk
from ._errors import invalid_argument
from ._torch_dtypes import FROM_DCP, TO_DCP, dtype_name  # noqa: F401 (hyperdcp.torch.*)

def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed
        return None
    return DTensor


def _sharded_tensor_class():
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
    except ImportError:
        return None
    return ShardedTensor


_DTENSOR = _dtensor_class()
_SHARDED_TENSOR = _sharded_tensor_class()
# A DTensor's box by its spec (mesh, placements, global shape): computing it costs tens of
# microseconds in torch, and a training job saves the same few thousand specs every time.
_BOXES: Dict[Any, Optional[Tuple[Tuple[int, ...], List[int], List[int]]]] = {}


def _compute_box(fqn: str, dt: Any) -> Optional[Tuple[Tuple[int, ...], List[int], List[int]]]:
    """(local shape, global shape, offsets) of this rank, None when it is not in the mesh."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    for p in dt.placements:
        if p.is_partial():
            raise invalid_argument(
                f"'{fqn}': DTensor placement {p} holds partial sums, not a box of the "
                "tensor; redistribute it to Shard or Replicate before saving")
    if dt.device_mesh.get_coordinate() is None:
        return None
    shape, offsets = compute_local_shape_and_global_offset(
        dt.shape, dt.device_mesh, dt.placements)
    return tuple(shape), list(dt.shape), list(offsets)


def dtensor_box(fqn: str, dt: Any) -> Optional[Tuple[torch.Tensor, List[int], List[int]]]:
    """(local tensor, global shape, offsets), or None when this rank is not in the mesh."""
    spec = getattr(dt, "_spec", None)
    try:
        box = _BOXES[spec]
    except (KeyError, TypeError):
        box = _compute_box(fqn, dt)
        if spec is not None:
            _BOXES[spec] = box
    if box is None:
        return None
    local = getattr(dt, "_local_tensor", None)
    if local is None:
        local = dt.to_local()
    shape, global_shape, offsets = box
    if shape != tuple(local.shape):
        raise invalid_argument(
            f"'{fqn}': DTensor placements {tuple(dt.placements)} on mesh "
            f"{tuple(dt.device_mesh.shape)} give this rank a local tensor of shape "
            f"{tuple(local.shape)}, not one box ({shape} at {tuple(offsets)}); "
            "such layouts cannot be stored as chunks")
    return local, global_shape, offsets


def torch_chunks(fqn: str, value: torch.Tensor, for_load: bool,
                 load_as: Optional[torch.dtype] = None) -> List[HostChunk]:
    """The chunks this rank holds: a ShardedTensor's local shards (FSDP1's
    SHARDED_STATE_DICT), a DTensor's box, a plain tensor whole."""
    if _DTENSOR is not None and isinstance(value, _DTENSOR):
        box = dtensor_box(fqn, value)
        if box is None:
            return []
        return [_chunk(fqn, *box, for_load, load_as)]
    if _SHARDED_TENSOR is not None and isinstance(value, _SHARDED_TENSOR):
        global_shape = list(value.size())
        return [_chunk(fqn, s.tensor, global_shape, list(s.metadata.shard_offsets), for_load,
                       load_as) for s in value.local_shards()]
    if value.is_nested:  # no one shape, no strides: not a box of one tensor
        raise invalid_argument(f"'{fqn}': a nested tensor cannot be saved or loaded; save its "
                               "components (unbind()) or a padded tensor instead")
    return [_chunk(fqn, value, list(value.shape), [0] * value.dim(), for_load, load_as)]


def torch_chunk(fqn: str, value: torch.Tensor, for_load: bool) -> Optional[HostChunk]:
    chunks = torch_chunks(fqn, value, for_load)
    if len(chunks) > 1:
        raise invalid_argument(f"'{fqn}': several local shards where one chunk was expected")
    return chunks[0] if chunks else None


_CPU = torch.device("cpu")


def _chunk(fqn: str, local: torch.Tensor, global_shape: List[int], offsets: List[int],
           for_load: bool, load_as: Optional[torch.dtype] = None) -> HostChunk:
    dtype = TO_DCP.get(local.dtype)
    if load_as is not None and load_as != local.dtype and for_load:
        # Loaded in the stored dtype into a staged copy, then cast by copy_, as torch does.
        host = torch.empty(local.shape, dtype=load_as, device="cpu")
        dst = local.detach()

        def cast_back(dst=dst, src=host):
            dst.copy_(src)

        return HostChunk(host, host.data_ptr(), dtype_name(fqn, load_as), host.shape,
                         global_shape, offsets, cast_back)
    if (dtype is not None and local.device == _CPU and local.layout == torch.strided and
            local.is_contiguous() and not local.is_conj() and not local.is_neg() and
            not local.is_quantized):
        # Its own memory: read by save, filled in place by load (the common case, kept short).
        return HostChunk(local, local.data_ptr(), dtype, local.shape, global_shape, offsets)
    local = local.detach()
    if local.layout != torch.strided or local.is_quantized:
        raise invalid_argument(f"'{fqn}': {local.layout} tensors are not supported")
    if local.device.type == "meta":
        raise invalid_argument(f"'{fqn}': a meta tensor has no data")
    dtype = dtype_name(fqn, local.dtype)
    if for_load:
        host = torch.empty(local.shape, dtype=local.dtype, device="cpu")

        def write_back(dst=local, src=host):
            dst.copy_(src)

        return HostChunk(host, host.data_ptr(), dtype, host.shape, global_shape, offsets,
                         write_back)
    host = local.to("cpu").resolve_conj().resolve_neg().contiguous()
    return HostChunk(host, host.data_ptr(), dtype, host.shape, global_shape, offsets)


def is_meta(value: Any) -> bool:
    """A tensor without data (built on the meta device), DTensor included; a ShardedTensor's
    local shards are its data (its own is_meta takes one shard only)."""
    if _SHARDED_TENSOR is not None and isinstance(value, _SHARDED_TENSOR):
        return False
    local = getattr(value, "_local_tensor", None)
    return (local if local is not None else value).is_meta


def materialize(value: Any) -> Any:
    """An uninitialised CPU tensor like the meta tensor `value` (a DTensor: the same mesh,
    placements and global shape, over a local tensor of this rank's shape)."""
    local = getattr(value, "_local_tensor", None)
    if local is None:
        return torch.empty(value.shape, dtype=value.dtype, device="cpu")
    new_local = torch.empty(local.shape, dtype=local.dtype, device="cpu")
    return _DTENSOR.from_local(new_local, value.device_mesh, value.placements, run_check=False,
                               shape=value.shape, stride=value.stride())
