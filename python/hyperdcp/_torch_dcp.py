"""Converters between torch.distributed.checkpoint's format and hyperdcp's, both ways, in one
process (adopting hyperdcp is reversible)."""

import os
from typing import Any, Dict

import torch

from ._api import load, save
from ._delegate import torch_function
from ._metadata import per_rank_value, read_metadata
from ._torch_dtypes import FROM_DCP


def from_torch_dcp(src: "os.PathLike | str", dst: "os.PathLike | str",
                   allow_pickle: bool = False) -> Any:
    """Converts a torch.distributed.checkpoint directory (saved by any number of ranks) into
    a dcp checkpoint at `dst`, in this process; returns the SaveResult.

    Every tensor is read whole into memory, so the process needs room for the whole
    checkpoint. The source format pickles non-tensor values and torch's loader unpickles
    them: convert only checkpoints you trust (dcp itself stores them as JSON).
    """
    import torch.distributed.checkpoint as torch_dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = torch_dcp.FileSystemReader(os.fspath(src))
    state: Dict[str, Any] = {}
    for fqn, md in reader.read_metadata().state_dict_metadata.items():
        is_tensor = isinstance(md, TensorStorageMetadata)
        state[fqn] = torch.empty(md.size, dtype=md.properties.dtype) if is_tensor else None
    torch_function("load")(state, storage_reader=reader, no_dist=True)  # torch's, installed or not
    return save(state, dst, no_dist=True, allow_pickle=allow_pickle)


def to_torch_dcp(src: "os.PathLike | str", dst: "os.PathLike | str",
                 allow_pickle: bool = False) -> None:
    """Writes the hyperdcp checkpoint `src` as a torch.distributed.checkpoint directory `dst`
    (values included), in this process, so that adopting hyperdcp is reversible.

    Entries keep their names; torch.distributed.checkpoint.load then fills any template
    whose flattened names match (the same state dict that was saved). Every tensor is read
    whole into memory. torch pickles the non-tensor values it writes.
    """
    import torch.distributed.checkpoint as torch_dcp

    md = read_metadata(src)
    state: Dict[str, Any] = {fqn: torch.empty(info.shape, dtype=FROM_DCP[info.dtype])
                             for fqn, info in md.tensors.items()}
    # A value saved per rank under its name: one value per name in torch's format (the
    # lowest saving rank's, as a load in another world gets).
    state.update({(per_rank_value(fqn) or (fqn,))[0]: None for fqn in md.bytes})
    load(state, src, no_dist=True, allow_pickle=allow_pickle)
    # torch's own save, even under hyperdcp.install(): the point is torch's format.
    torch_function("save")(state, storage_writer=torch_dcp.FileSystemWriter(os.fspath(dst)),
                           no_dist=True)
