"""hyperdcp: distributed checkpoints for PyTorch training jobs, on a C++ engine.

A drop-in for torch.distributed.checkpoint: change one import,

    import hyperdcp as dcp   # was: import torch.distributed.checkpoint as dcp
    dcp.save({"model": model, "optim": optim, "step": 100}, checkpoint_id="/ckpt/step_100")
    dcp.load(state_dict, checkpoint_id="/ckpt/step_100")  # in place, resharding as needed

Under torchrun every rank calls save/load with the job's process group (the default one unless
`process_group` is given); without an initialised process group, a world of one. Errors are
DcpError, on every rank. torch DCP's other names (FileSystemWriter, DefaultLoadPlanner,
state_dict, stateful, ...) are torch's own, reached through this module.

For frameworks whose code imports torch DCP itself (torchtitan, accelerate, Lightning,
torchtune): one `hyperdcp.install()` (or `python -m hyperdcp.run train.py ...`) makes torch's
own save, load and async_save run on hyperdcp for every caller in the process.

Documentation (in the source repository): docs/python.md (this API), docs/frameworks.md,
docs/manager.md (CheckpointManager, MemoryTier), docs/object-storage.md (s3:// ids),
docs/troubleshooting.md (errors), docs/security.md (allow_pickle and what loading trusts).
"""

from ._api import (AsyncSaveHandle, SaveFuture, async_save, load, prepare_async_save, save,
                   set_async_options)
from ._chunks import TensorChunk
from ._comm import set_timeout
from ._dcp import DcpError, LoadResult, SaveResult, StagingStats
from ._dcp import __version__
from ._install import install, uninstall
from ._metadata import Metadata, TensorInfo, read_metadata
from ._open import load_all
from .manager import CheckpointManager, MemoryTier, unlock


def from_torch_dcp(src, dst, allow_pickle: bool = False) -> SaveResult:
    """Converts a torch.distributed.checkpoint checkpoint into a hyperdcp one (in this
    process)."""
    from ._torch_dcp import from_torch_dcp as convert  # imports torch only when called

    return convert(src, dst, allow_pickle)


def to_torch_dcp(src, dst, allow_pickle: bool = False) -> None:
    """Writes a hyperdcp checkpoint as a torch.distributed.checkpoint one, values included
    (in this process)."""
    from ._torch_dcp import to_torch_dcp as convert

    convert(src, dst, allow_pickle)


# Names of torch.distributed.checkpoint that a script may reach through `dcp.`: torch's own
# objects (save and load accept its FileSystemWriter/Reader and default planners).
_FROM_TORCH = {
    "FileSystemWriter", "FileSystemReader", "DefaultSavePlanner", "DefaultLoadPlanner",
    "CheckpointException", "Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
    "state_dict", "stateful", "staging", "format_utils", "AsyncCheckpointerType",
    "AsyncSaveResponse",
}


def __getattr__(name: str):
    if name == "HyperdcpReader":  # imports torch
        from ._torch_reader import HyperdcpReader

        return HyperdcpReader
    if name in _FROM_TORCH:
        import importlib

        torch_dcp = importlib.import_module("torch.distributed.checkpoint")
        if name in ("state_dict", "stateful", "staging", "format_utils"):
            return importlib.import_module(f"torch.distributed.checkpoint.{name}")
        if name in ("AsyncCheckpointerType", "AsyncSaveResponse"):
            return getattr(importlib.import_module(
                "torch.distributed.checkpoint.state_dict_saver"), name)
        return getattr(torch_dcp, name)
    raise AttributeError(f"module 'hyperdcp' has no attribute {name!r}")


__all__ = [
    "AsyncSaveHandle", "CheckpointManager", "DcpError", "LoadResult", "MemoryTier", "Metadata",
    "HyperdcpReader", "SaveFuture",
    "SaveResult", "StagingStats", "TensorChunk", "TensorInfo", "__version__", "async_save",
    "from_torch_dcp", "install", "load", "load_all", "prepare_async_save", "read_metadata", "save",
    "set_async_options", "set_timeout",
    "to_torch_dcp", "uninstall", "unlock",
]
