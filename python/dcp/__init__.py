"""dcp: distributed checkpoints for PyTorch training jobs, on a C++ engine.

    import dcp
    dcp.save({"model": model.state_dict(), "step": 100}, "/ckpt/step_100")
    dcp.load(state_dict, "/ckpt/step_100")  # fills tensors in place, resharding as needed

Shaped like torch.distributed.checkpoint: under torchrun every rank calls save/load with the
job's process group (the default one unless `process_group` is given); without an
initialised process group, a world of one. Errors are DcpError, on every rank.
"""

from ._checkpoint import AsyncSaveHandle, async_save, load, prepare_async_save, save
from ._chunks import TensorChunk
from ._comm import set_timeout
from ._dcp import DcpError, LoadResult, SaveResult, StagingStats
from ._metadata import Metadata, TensorInfo, read_metadata
from .manager import CheckpointManager



def from_torch_dcp(src, dst) -> SaveResult:
    """Converts a torch.distributed.checkpoint checkpoint into a dcp one (dcp.torch)."""
    from .torch import from_torch_dcp as convert  # imports torch only when called

    return convert(src, dst)


__all__ = [
    "AsyncSaveHandle", "CheckpointManager", "DcpError", "LoadResult", "Metadata", "SaveResult", "StagingStats",
    "TensorChunk", "TensorInfo", "async_save", "from_torch_dcp", "load", "prepare_async_save",
    "read_metadata", "save", "set_timeout",
]
