"""install() / uninstall(): torch.distributed.checkpoint served by hyperdcp for every caller in
the process, frameworks included.

Replaced: torch DCP's save, load, async_save, save_state_dict and load_state_dict in torch's
modules and wherever another module holds them already (`from torch.distributed.checkpoint
import save` done before install()); torch's FileSystemReader reads hyperdcp checkpoints (its
read_metadata, set_up_storage_reader and read_data, for directories holding one). What hyperdcp
does not serve goes on to torch's own functions (hyperdcp._delegate)."""

import os
import sys
import threading
from typing import Any, Callable, Dict, List, Tuple

from . import _delegate

_lock = threading.Lock()
# (owner, attribute, what was there): every replacement made, to undo in reverse order.
_replaced: List[Tuple[Any, str, Any]] = []


def _save_state_dict(state_dict: Any, storage_writer: Any, process_group: Any = None,
                     coordinator_rank: int = 0, no_dist: bool = False,
                     planner: Any = None) -> Any:
    """torch's deprecated save_state_dict, on hyperdcp."""
    from ._api import save

    return save(state_dict, storage_writer=storage_writer, process_group=process_group,
                no_dist=no_dist, planner=planner)


def _load_state_dict(state_dict: Any, storage_reader: Any, process_group: Any = None,
                     coordinator_rank: int = 0, no_dist: bool = False,
                     planner: Any = None) -> Any:
    """torch's deprecated load_state_dict, on hyperdcp."""
    from ._api import load

    return load(state_dict, storage_reader=storage_reader, process_group=process_group,
                no_dist=no_dist, planner=planner)


def _replacements() -> Dict[str, Callable[..., Any]]:
    from ._api import async_save, load, save

    return {"save": save, "load": load, "async_save": async_save,
            "save_state_dict": _save_state_dict, "load_state_dict": _load_state_dict}


def _reader_methods() -> Dict[str, Callable[..., Any]]:
    """FileSystemReader's methods that serve a hyperdcp checkpoint, else do what they did."""
    from ._formats import holds_hyperdcp_format
    from ._torch_reader import _done, read_requests, torch_metadata

    FileSystemReader = sys.modules["torch.distributed.checkpoint.filesystem"].FileSystemReader
    before = {name: FileSystemReader.__dict__[name]
              for name in ("read_metadata", "set_up_storage_reader", "read_data")}

    def serves(reader: Any) -> bool:
        # torch's FileSystemReader itself on a local directory; its subclasses (fsspec's,
        # s3torchconnector's, HuggingFace's) read what they read.
        return type(reader) is FileSystemReader and "://" not in os.fspath(reader.path) and \
            holds_hyperdcp_format(reader.path)

    def read_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        if serves(self):
            return torch_metadata(os.fspath(self.path))
        return before["read_metadata"](self, *args, **kwargs)

    def set_up_storage_reader(self: Any, metadata: Any, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if serves(self):
            self.storage_data = {}
            return None
        return before["set_up_storage_reader"](self, metadata, is_coordinator, *args, **kwargs)

    def read_data(self: Any, plan: Any, planner: Any) -> Any:
        if serves(self):
            read_requests(os.fspath(self.path), plan, planner)
            return _done()
        return before["read_data"](self, plan, planner)

    return {"read_metadata": read_metadata, "set_up_storage_reader": set_up_storage_reader,
            "read_data": read_data}


def _replace(owner: Any, name: str, value: Any) -> None:
    _replaced.append((owner, name, getattr(owner, name)))
    setattr(owner, name, value)


def installed() -> bool:
    return bool(_replaced)


def install() -> None:
    """Makes torch.distributed.checkpoint's save, load and async_save (and the deprecated
    save_state_dict / load_state_dict) run on hyperdcp for every caller in this process,
    modules that imported them earlier included, and torch's FileSystemReader read hyperdcp
    checkpoints. Calls hyperdcp does not serve go on to torch's own code. A second call does
    nothing; uninstall() undoes it."""
    with _lock:
        if _replaced:
            return
        try:
            _install()
        except BaseException:  # never half installed: what was replaced goes back
            _restore()
            raise


def _install() -> None:
    import importlib

    import torch.distributed.checkpoint  # noqa: F401  (its modules, to patch)

    for name, (module, attr) in _delegate.ENTRY_POINTS.items():
        fn = getattr(importlib.import_module(module), attr, None)
        if fn is not None:
            _delegate.originals[name] = fn
    new = _replacements()
    swaps = {id(fn): (fn, new[name]) for name, fn in _delegate.originals.items()}
    for module in list(sys.modules.values()):
        try:  # a module whose namespace cannot be read or written is left alone
            if module is None or str(getattr(module, "__name__", "")).startswith("hyperdcp"):
                continue
            for attr, value in list(vars(module).items()):
                swap = swaps.get(id(value))
                if swap is not None and swap[0] is value:
                    _replace(module, attr, swap[1])
        except Exception:
            continue
    FileSystemReader = sys.modules["torch.distributed.checkpoint.filesystem"].FileSystemReader
    for name, method in _reader_methods().items():
        _replace(FileSystemReader, name, method)


def uninstall() -> None:
    """Gives torch.distributed.checkpoint back its own functions everywhere install()
    replaced them (a module that imported them while installed keeps hyperdcp's)."""
    with _lock:
        _restore()


def _restore() -> None:
    while _replaced:
        owner, name, value = _replaced.pop()
        setattr(owner, name, value)
    _delegate.originals.clear()
