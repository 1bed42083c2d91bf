"""Calls hyperdcp hands to torch.distributed.checkpoint's own implementation (a writer, reader,
planner or stager it does not serve; a directory in torch's format; a URL scheme only torch's
fsspec storage reaches). torch's functions as they were before hyperdcp.install(), so a call
never comes back here; a hyperdcp checkpoint that torch is asked to read is read through
HyperdcpReader."""

import importlib
import logging
import os
from typing import Any, Dict, Optional

from ._torch_args import Delegate

_log = logging.getLogger("hyperdcp")
_said = set()

_SAVER = "torch.distributed.checkpoint.state_dict_saver"
_LOADER = "torch.distributed.checkpoint.state_dict_loader"
# name -> (module, attribute) of torch's entry points that install() replaces.
ENTRY_POINTS = {
    "save": (_SAVER, "save"),
    "async_save": (_SAVER, "async_save"),
    "save_state_dict": (_SAVER, "save_state_dict"),
    "load": (_LOADER, "load"),
    "load_state_dict": (_LOADER, "load_state_dict"),
}
# torch's functions captured by install() before it replaced them.
originals: Dict[str, Any] = {}


def torch_function(name: str) -> Any:
    """torch's own `name` (save, load, async_save, ...), never hyperdcp's replacement."""
    if name in originals:
        return originals[name]
    module, attr = ENTRY_POINTS[name]
    return getattr(importlib.import_module(module), attr)


def _say(why: Delegate) -> None:
    if why.reason not in _said:
        _said.add(why.reason)
        _log.warning("hyperdcp: %s; torch.distributed.checkpoint serves this call", why.reason)


def _directory_of(checkpoint_id: Any, storage: Any) -> Optional[str]:
    if checkpoint_id is not None:
        return os.fspath(checkpoint_id)
    path = getattr(storage, "path", None)
    return None if path is None else os.fspath(path)


def _drop_older_hyperdcp_checkpoint(directory: Optional[str], process_group: Any,
                                    no_dist: bool) -> None:
    """After torch saved into a directory that held a hyperdcp checkpoint, the older one's
    metadata goes (on one rank), so that every reader takes torch's."""
    from ._formats import COMMITTED, holds_torch_format

    if directory is None or not holds_torch_format(directory):
        return
    import torch.distributed as dist

    if not no_dist and dist.is_available() and dist.is_initialized() and \
            dist.get_rank(process_group) != 0:
        return
    try:
        os.remove(os.path.join(directory, COMMITTED))
    except FileNotFoundError:
        pass


def save(why: Delegate, state_dict: Any, checkpoint_id: Any, storage_writer: Any, planner: Any,
         process_group: Any, no_dist: bool, use_collectives: bool) -> Any:
    _say(why)
    result = torch_function("save")(state_dict, checkpoint_id=checkpoint_id,
                                    storage_writer=storage_writer, planner=planner,
                                    process_group=process_group, no_dist=no_dist,
                                    use_collectives=use_collectives)
    _drop_older_hyperdcp_checkpoint(_directory_of(checkpoint_id, storage_writer),
                                    process_group, no_dist)
    return result


def async_save(why: Delegate, state_dict: Any, checkpoint_id: Any, storage_writer: Any,
               planner: Any, process_group: Any, async_checkpointer_type: Any,
               async_stager: Any, no_dist: bool, use_collectives: bool) -> Any:
    _say(why)
    kwargs: Dict[str, Any] = {}
    if async_checkpointer_type is not None:
        kwargs["async_checkpointer_type"] = async_checkpointer_type
    return torch_function("async_save")(state_dict, checkpoint_id=checkpoint_id,
                                        storage_writer=storage_writer, planner=planner,
                                        process_group=process_group, async_stager=async_stager,
                                        no_dist=no_dist, use_collectives=use_collectives,
                                        **kwargs)


def _reader_for(directory: Optional[str], storage_reader: Any) -> Any:
    """A hyperdcp checkpoint is read through HyperdcpReader when torch would otherwise use
    its FileSystemReader (which cannot read it)."""
    from ._torch_args import _is_s3_connector, _is_torch
    from ._formats import holds_hyperdcp_format

    plain = storage_reader is None or _is_torch(storage_reader, ("FileSystemReader",)) or \
        _is_s3_connector(storage_reader, ("S3StorageReader",))
    if plain and directory is not None and holds_hyperdcp_format(directory):
        from ._torch_reader import HyperdcpReader

        return HyperdcpReader(directory)
    return storage_reader


def load(why: Delegate, state_dict: Any, checkpoint_id: Any, storage_reader: Any, planner: Any,
         process_group: Any, no_dist: bool, allow_partial: bool) -> Any:
    _say(why)
    directory = _directory_of(checkpoint_id, storage_reader)
    reader = _reader_for(directory, storage_reader)
    if reader is not storage_reader:
        checkpoint_id = None
    if planner is None and allow_partial:
        from torch.distributed.checkpoint import DefaultLoadPlanner

        planner = DefaultLoadPlanner(allow_partial_load=True)
    return torch_function("load")(state_dict, checkpoint_id=checkpoint_id,
                                  storage_reader=reader, planner=planner,
                                  process_group=process_group, no_dist=no_dist)
