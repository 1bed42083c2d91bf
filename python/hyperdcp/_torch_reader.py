"""hyperdcp checkpoints through torch's StorageReader interface, so torch's own tools read them
(merge_fsdp_weights, dcp_to_torch_save, _load_state_dict_from_keys, planners of their own):
read_metadata answers torch's Metadata, read_data fills the requests of torch's planner, each
tensor's requested box read once by the engine."""

import io
import os
import uuid
from typing import Any, Dict, List, Tuple

import torch
from torch.distributed.checkpoint import metadata as tm
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader

from ._errors import invalid_argument
from ._formats import holds_hyperdcp_format

def torch_metadata(directory: str) -> tm.Metadata:
    """The checkpoint's metadata as torch's planners read it: every tensor with its stored
    chunks, every value as bytes, and (planner_data) each entry's path in the saved state dict."""
    from ._metadata import read_metadata
    from ._torch_dtypes import FROM_DCP

    md = read_metadata(directory)
    entries: Dict[str, Any] = {}
    for fqn, info in md.tensors.items():
        dtype = FROM_DCP.get(info.dtype)
        if dtype is None:
            raise invalid_argument(f"{directory}: '{fqn}' is stored as {info.dtype}, which has "
                                   "no torch dtype here")
        entries[fqn] = tm.TensorStorageMetadata(
            properties=tm.TensorProperties(dtype=dtype), size=torch.Size(info.shape),
            chunks=[tm.ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(n))
                    for o, n in info.chunks])
    for fqn in md.bytes:  # a value saved per rank under its name: each rank reads its own
        entries[_base_name(fqn)] = tm.BytesStorageMetadata()
    return tm.Metadata(state_dict_metadata=entries, planner_data=_torch_paths(md.raw_paths),
                       storage_data={},
                       storage_meta=tm.StorageMeta(checkpoint_id=directory,
                                                   load_id=uuid.uuid4().hex))


def _torch_paths(raw_paths: Dict[str, bytes]) -> Dict[str, Tuple[Any, ...]]:
    """Each entry's path as torch's flattening spells it: dict keys as strings, list and
    tuple positions as ints (torch rebuilds lists for those)."""
    from ._paths import decode

    return {_base_name(fqn): tuple(key if kind in ("l", "t") else str(key)
                                   for kind, key in decode(fqn, raw))
            for fqn, raw in raw_paths.items()}


def _base_name(fqn: str) -> str:
    from ._metadata import per_rank_value

    variant = per_rank_value(fqn)
    return fqn if variant is None else variant[0]


Box = Tuple[List[int], List[int]]  # low corner, high corner (exclusive)


def _request_box(req: Any) -> Box:
    low = [o + s for o, s in zip(req.storage_index.offset, req.storage_offsets)]
    return low, [lo + n for lo, n in zip(low, req.lengths)]


def read_requests(directory: str, plan: LoadPlan, planner: LoadPlanner) -> None:
    """Fills torch planner's requests from a hyperdcp checkpoint, on this rank alone: the
    smallest box holding each tensor's requests is read once (checksums verified), values are
    handed to the planner as torch.save bytes, as torch's reader hands them."""
    from ._chunk_types import TensorChunk
    from ._comm import comm_for
    from ._load_engine import load_directory

    from ._metadata import read_metadata
    from ._torch_dtypes import FROM_DCP

    md = read_metadata(directory)  # once: the values' names and the tensors' dtypes and shapes
    stored = _value_names(md)
    boxes: Dict[str, Box] = {}
    for req in plan.items:
        if req.type == LoadItemType.BYTE_IO:
            continue
        low, high = _request_box(req)
        fqn = req.storage_index.fqn
        if fqn in boxes:
            old_low, old_high = boxes[fqn]
            low = [min(a, b) for a, b in zip(low, old_low)]
            high = [max(a, b) for a, b in zip(high, old_high)]
        boxes[fqn] = (low, high)
    flat: Dict[str, Any] = {stored.get(req.storage_index.fqn, req.storage_index.fqn): None
                            for req in plan.items if req.type == LoadItemType.BYTE_IO}
    for fqn, (low, high) in boxes.items():
        info = md.tensors[fqn]
        data = torch.empty([h - lo for lo, h in zip(low, high)], dtype=FROM_DCP[info.dtype])
        flat[fqn] = TensorChunk(data, list(info.shape), low)
    if flat:
        load_directory(flat, directory, comm_for(None, True))
    for req in plan.items:
        fqn = req.storage_index.fqn
        if req.type == LoadItemType.BYTE_IO:
            stream = io.BytesIO()
            torch.save(flat[stored.get(fqn, fqn)], stream)
            stream.seek(0)
            planner.load_bytes(req, stream)
            continue
        chunk = flat[fqn]
        low, _ = _request_box(req)
        src = chunk.data
        for dim, (lo, start, n) in enumerate(zip(low, chunk.offsets, req.lengths)):
            src = src.narrow(dim, lo - start, n)
        target = planner.resolve_tensor(req).detach()
        if target.size() != src.size():
            raise invalid_argument(f"'{fqn}': torch's planner asks for {list(target.size())} "
                                   f"where the request reads {list(src.size())}")
        target.copy_(src)
        planner.commit_tensor(req, target)


def _value_names(md: Any) -> Dict[str, str]:
    """For each value saved per rank, the name to read it under here: this rank's own when the
    job has the saving job's ranks (torch.distributed's rank and world), else the lowest saving
    rank's. The reads run as a world of one, where the lowest rank's value answers the plain
    name and every other keeps its per-rank name."""
    import torch.distributed as dist

    from ._metadata import per_rank_value

    ranks: Dict[str, List[int]] = {}
    for fqn in md.bytes:
        variant = per_rank_value(fqn)
        if variant is not None:
            ranks.setdefault(variant[0], []).append(variant[1])
    if not ranks:
        return {}
    on = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if on else (0, 1)
    names = {}
    for name, saved in ranks.items():
        pick = rank if world == md.world_size and rank in saved else min(saved)
        names[name] = name if pick == min(saved) else f"{name}.__dcp_rank_{pick}"
    return names


def _done() -> Any:
    """A completed torch.futures.Future, what torch's readers return (it waits on it)."""
    fut: Any = torch.futures.Future()
    fut.set_result(None)
    return fut


class HyperdcpReader(StorageReader):
    """A torch StorageReader over a hyperdcp checkpoint (local or s3://): hand it to torch's
    load or to tools that take a reader. Each rank reads what its planner asks, alone."""

    def __init__(self, path: "str | os.PathLike") -> None:
        super().__init__()
        self.path = os.fspath(path)

    def reset(self, checkpoint_id: "str | os.PathLike | None" = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: "str | os.PathLike") -> bool:
        return holds_hyperdcp_format(os.fspath(checkpoint_id))

    def read_metadata(self, *args: Any, **kwargs: Any) -> tm.Metadata:
        return torch_metadata(self.path)

    def set_up_storage_reader(self, metadata: tm.Metadata, is_coordinator: bool,
                              *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Any:
        read_requests(self.path, plan, planner)
        return _done()
