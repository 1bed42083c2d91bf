"""A state dict -> the engine's StateDict over its memory, and the loaded values back.

Stateful objects (anything with state_dict() and load_state_dict(), as torch's Stateful) at
the top level are saved through state_dict(); on load their state_dict() is the template,
loaded in place, then handed to load_state_dict(): torch.distributed.checkpoint's meaning.
"""

import hashlib
import json
import sys
import time
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional

from . import _boundary, _dcp, _values
from ._chunks import HostChunk, host_chunks, is_tensor, is_torch_tensor
from ._errors import DcpError, error
from ._flatten import Flat, flatten, set_leaves


def is_stateful(obj: Any) -> bool:
    return (not isinstance(obj, Mapping) and callable(getattr(obj, "state_dict", None)) and
            callable(getattr(obj, "load_state_dict", None)))


class Prepared:
    """An engine StateDict over the caller's state, and what must outlive the engine call."""

    def __init__(self, state_dict: Mapping) -> None:
        if not isinstance(state_dict, Mapping):
            raise error("INVALID_ARGUMENT",
                        f"state_dict must be a dict, not {type(state_dict).__name__}")
        self.started = time.perf_counter()
        self.original = state_dict
        # A shallow copy with every Stateful replaced by its state_dict().
        self.state = {k: (v.state_dict() if is_stateful(v) else v) for k, v in state_dict.items()}
        self.flat: Flat = flatten(self.state, is_tensor, is_torch_tensor)
        self.sd = _dcp.StateDict()
        self.chunks: List[HostChunk] = []
        self.values: List[str] = []  # fqns of non-tensor entries
        self.digests: Dict[str, str] = {}  # fqn -> digest of the stored value (save)

    def python_seconds(self) -> float:
        return time.perf_counter() - self.started


def prepare(state_dict: Mapping, for_load: bool, allow_pickle: bool = False) -> Prepared:
    p = Prepared(state_dict)
    for fqn, leaf in p.flat.leaves.items():
        if is_tensor(leaf):
            for chunk in host_chunks(fqn, leaf, for_load):
                p.sd.add_tensor(fqn, chunk.data_ptr, chunk.dtype, chunk.shape,
                                chunk.global_shape, chunk.offsets)
                p.chunks.append(chunk)
        elif for_load:
            p.sd.add_bytes(fqn, b"")
            p.values.append(fqn)
        else:
            data = _values.encode(fqn, leaf, allow_pickle)
            p.sd.add_bytes(fqn, data)
            p.values.append(fqn)
            p.digests[fqn] = hashlib.blake2b(data, digest_size=12).hexdigest()
    return p


def _agree(comm: Any, failure: Optional[BaseException], digests: Dict[str, str]) -> None:
    """Every rank learns every rank's preparation outcome; raises the same error on each.

    Also: a non-tensor value saved under one name must be the same on every rank holding it
    (the save keeps one copy), so a difference is an error naming the entry and the ranks.
    """
    message = code = None
    if failure is not None:
        message = str(failure) if isinstance(failure, DcpError) else \
            f"{type(failure).__name__}: {failure}"
        code = getattr(failure, "code", "INVALID_ARGUMENT")
    mine = json.dumps({"error": message, "code": code, "values": digests}).encode()
    everyone = [json.loads(b) for b in _boundary.call(comm, _dcp.all_gather, comm, mine)]
    for rank, doc in enumerate(everyone):  # the first failure, the same error on every rank
        if doc["error"] is not None:
            raise error(doc["code"], f"rank {rank}: {doc['error']}") from failure
    holders: Dict[str, Dict[str, List[int]]] = {}
    for rank, doc in enumerate(everyone):
        for fqn, digest in doc["values"].items():
            holders.setdefault(fqn, {}).setdefault(digest, []).append(rank)
    for fqn in sorted(holders):
        if len(holders[fqn]) > 1:
            groups = sorted(holders[fqn].values())
            raise error("INVALID_ARGUMENT",
                        f"'{fqn}' is a non-tensor value that differs between ranks "
                        f"({' vs '.join(str(g) for g in groups)}); one name holds one value: "
                        "give per-rank values per-rank names (e.g. f'rng.{rank}')")


def prepare_on_every_rank(state_dict: Mapping, comm: Any, for_load: bool, agree: bool,
                          allow_pickle: bool = False,
                          precheck: Optional[Callable[[], None]] = None) -> Prepared:
    """prepare() (after `precheck`), with a failure on any rank raised on every rank (none
    then enters the engine), and the non-tensor values checked across ranks."""
    failure: Optional[BaseException] = None
    p = None
    try:
        if precheck is not None:
            precheck()
        p = prepare(state_dict, for_load, allow_pickle)
    except Exception as e:  # any rank's failure must reach every rank, not hang them
        failure = e
    if agree and comm.size > 1:
        _agree(comm, failure, p.digests if p is not None else {})
    if failure is not None:
        raise failure
    return p


def finish_load(p: Prepared, allow_pickle: bool = False) -> None:
    """After the engine filled `p.sd`: staged chunks copied back into their tensors, autograd
    told of the in-place writes, non-tensor values replaced, Stateful objects loaded."""
    torch = sys.modules.get("torch")
    bump = getattr(getattr(getattr(torch, "autograd", None), "graph", None),
                   "increment_version", None)
    for chunk in p.chunks:
        if chunk.write_back is not None:
            chunk.write_back()  # a copy_: autograd sees it
        elif bump is not None and torch is not None and isinstance(chunk.owner, torch.Tensor):
            bump(chunk.owner)  # as copy_ would: a saved-for-backward use of it now fails
    loaded: Dict[str, Any] = {}
    for fqn in p.values:
        data = p.sd.bytes_of(fqn)
        if data:  # empty: skipped by a partial load (a stored value is never empty)
            loaded[fqn] = _values.decode(fqn, data, allow_pickle)
    set_leaves(p.state, p.flat, loaded)
    for key, elem in p.original.items():
        if is_stateful(elem):
            elem.load_state_dict(p.state[key])
        elif p.state[key] is not elem:
            p.original[key] = p.state[key]
