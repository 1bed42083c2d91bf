"""A state dict -> the engine's StateDict over its memory, and the loaded values back.

Stateful objects (anything with state_dict() and load_state_dict(), as torch's Stateful) at
the top level are saved through state_dict(); on load their state_dict() is the template,
loaded in place, then handed to load_state_dict(): torch.distributed.checkpoint's meaning.
"""

import gc
import json
import operator
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional

from . import _boundary, _dcp, _paths, _values
from ._chunks import host_chunks, is_tensor, is_tensor_type, is_torch_tensor
from ._errors import DcpError, error, invalid_argument
from ._flatten import Flat, flatten, set_leaves


_NEVER_STATEFUL = (int, float, str, bool, bytes, type(None), dict, list, tuple)


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
        # A shallow copy with every Stateful replaced by its state_dict() (a flat dict of
        # tensors and numbers, as a model's, holds none: told by its few types).
        types = set(map(type, state_dict.values()))
        self.stateful: List[Any] = []  # the keys of the Stateful entries
        if all(t in _NEVER_STATEFUL or is_tensor_type(t) for t in types):
            self.state = dict(state_dict)
        else:
            self.stateful = [k for k, v in state_dict.items() if is_stateful(v)]
            self.state = dict(state_dict)
            for k in self.stateful:
                self.state[k] = state_dict[k].state_dict()
        self.flat: Flat = flatten(self.state, is_tensor_type, is_torch_tensor)
        self.sd: Any = None
        self.owners: List[Any] = []  # the memory the engine reads or fills: kept alive
        self.write_backs: List[Callable[[], None]] = []  # load: staged copies -> tensors
        self.replacements: Dict[str, Any] = {}  # load: meta tensors -> the allocated ones
        # Tensor leaves this rank holds no chunk of (a DTensor on a mesh without this rank).
        self.absent: List[str] = []
        self.layout: Optional[list] = None  # save: the paths and container kinds (Flat.layout)
        self.cache_key: Optional[tuple] = None
        self.signatures: Optional["Signatures"] = None  # of the tensor leaves, when cacheable

    def python_seconds(self) -> float:
        return time.perf_counter() - self.started


# Preparation reused across calls on the same state (the same names, and tensors with the
# same memory, dtype, shape and layout): a training job saves the same few thousand tensors
# again and again, and building the engine's StateDict costs microseconds per tensor. An
# entry holds no tensor (signatures only), and is taken out while a call uses it.
_CACHE: "OrderedDict[tuple, Prepared]" = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 4


def _signature(leaf: Any) -> Optional[tuple]:
    """(local tensor, spec) of a CPU tensor that the engine uses in place (spec None for a
    plain tensor); None for anything else (it is prepared anew each time)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(leaf, torch.Tensor):
        return None
    spec = getattr(leaf, "_spec", None)
    if spec is None and type(leaf) not in (torch.Tensor, torch.nn.Parameter):
        return None  # a ShardedTensor or another subclass: prepared anew each time
    local = getattr(leaf, "_local_tensor", None) if spec is not None else leaf
    if local is None or not local.is_cpu or not local.is_contiguous():
        return None
    return local, spec


_SPEC, _LOCAL = operator.attrgetter("_spec"), operator.attrgetter("_local_tensor")
_DTYPE, _SHAPE, _IS_CPU, _IS_NESTED = (operator.attrgetter(a)
                                       for a in ("dtype", "shape", "is_cpu", "is_nested"))


_UNTESTED = object()  # a self-tested torch feature not tried yet
_GUARDS: Any = _UNTESTED


def _tensor_guards() -> Any:
    """torch's own batched check of tensors (torch.compile's guards, in C++: class, dtype,
    device and dispatch bits such as conjugate and negative views, requires_grad, sizes and
    strides), about 0.08 us a tensor where reading those attributes from Python costs about
    0.7; None where this torch lacks it or it does not behave as relied on here (then the
    attributes are read one by one)."""
    global _GUARDS
    if _GUARDS is not _UNTESTED:
        return _GUARDS
    _GUARDS = None
    try:
        from torch._C._dynamo.guards import TensorGuards
        torch = sys.modules["torch"]
        square = torch.arange(16.0).reshape(4, 4)
        z = torch.complex(torch.arange(4.0), torch.ones(4))
        g = _make_guards(TensorGuards, [square, z])
        ok = (g.check(square, z) and g.check(square.clone(), z.clone()) and
              not g.check(square.t(), z) and not g.check(square, z.conj()) and
              not g.check(square.to(torch.float64), z) and
              not g.check(torch._neg_view(square), z) and
              not g.check(square.reshape(2, 8), z) and
              not g.check(torch.nn.Parameter(square, requires_grad=False), z))
        if ok:
            _GUARDS = TensorGuards
    except Exception:  # an older or newer torch: the attributes one by one
        pass
    return _GUARDS


_DATA_PTR_FN: Any = _UNTESTED


def _data_ptr_fn() -> Optional[int]:
    """The address of torch's C function from a tensor object to its data pointer (what
    inductor's generated code reads tensors with), for the engine's one-pass check of a
    reused preparation; None where this torch lacks it or it does not give what
    Tensor.data_ptr() does (then that check runs in Python, field by field)."""
    global _DATA_PTR_FN
    if _DATA_PTR_FN is not _UNTESTED:
        return _DATA_PTR_FN
    _DATA_PTR_FN = None
    try:
        from torch._C._dynamo.guards import _torchinductor_pyobject_tensor_data_ptr as fn
        torch = sys.modules["torch"]
        if not isinstance(fn, int):
            return None
        base = torch.arange(16.0)
        tensors = [base, base[3:], torch.nn.Parameter(torch.ones(2), requires_grad=False)]
        sigs = _dcp.TensorSignatures(list(map(type, tensors)), [None] * len(tensors),
                                     list(map(torch.Tensor.data_ptr, tensors)), int(fn))
        moved = [base.clone(), tensors[1], tensors[2]]
        sparse = [torch.eye(4).to_sparse(), tensors[1], tensors[2]]  # no data pointer
        found = sigs.match(tensors)
        if (found is not None and all(map(operator.is_, found, tensors)) and
                sigs.match(moved) is None and sigs.match(sparse) is None):
            _DATA_PTR_FN = int(fn)
    except Exception:  # an older or newer torch: the Python check
        pass
    return _DATA_PTR_FN


def _make_guards(guards: Any, tensors: List[Any]) -> Any:
    # No dynamic dimensions: every size and stride as the tensors have them now.
    return guards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)


class Signatures:
    """What a reused preparation must find again: the leaves' classes, the DTensors' specs,
    and the local tensors' memory and what torch's guards check of them (all were contiguous
    on the CPU); without those guards, their dtypes and shapes, read one by one. Checked in
    one pass of the engine's (`native`) where torch gives C code a tensor's data pointer,
    else by column (one C-level map per field instead of a Python loop per tensor)."""

    __slots__ = ("kinds", "dtensors", "specs", "ptrs", "dtypes", "shapes", "guards", "native")

    def __init__(self, leaves: List[Any], got: List[tuple]) -> None:
        self.kinds = list(map(type, leaves))
        self.dtensors = [i for i, (_, spec) in enumerate(got) if spec is not None]
        self.specs = [got[i][1] for i in self.dtensors]
        locals_ = [local for local, _ in got]
        guards = _tensor_guards()
        # The guards refuse one tensor passed twice (tied weights under two names): those
        # states are checked attribute by attribute.
        if guards is not None and len(set(map(id, locals_))) != len(locals_):
            guards = None
        # The guards hold no tensor, only what they check.
        self.guards = _make_guards(guards, locals_) if guards is not None else None
        self.ptrs = list(map(sys.modules["torch"].Tensor.data_ptr, locals_))
        self.dtypes = self.shapes = None  # what the guards check, read by hand without them
        if self.guards is None:
            self.dtypes, self.shapes = list(map(_DTYPE, locals_)), list(map(_SHAPE, locals_))
        # Class, spec, local tensor and memory checked in one pass over the leaves (the
        # engine's), where torch gives a tensor's data pointer to C code.
        fn = _data_ptr_fn() if self.guards is not None else None
        self.native = None
        if fn is not None:
            specs = [spec for _, spec in got]
            self.native = _dcp.TensorSignatures(self.kinds, specs, self.ptrs, fn)

    def match(self, leaves: List[Any]) -> Optional[List[Any]]:
        """The local tensors of `leaves` when they match, else None."""
        if self.native is not None:
            locals_ = self.native.match(leaves)
            return locals_ if locals_ is not None and self.guards.check(*locals_) else None
        if len(leaves) != len(self.kinds) or list(map(type, leaves)) != self.kinds:
            return None
        every = len(self.dtensors) == len(leaves)
        dtensors = leaves if every else [leaves[i] for i in self.dtensors]
        if list(map(_SPEC, dtensors)) != self.specs:  # specs: identity first, then ==
            return None
        if every:
            locals_ = list(map(_LOCAL, leaves))
        else:
            locals_ = list(leaves)
            for i, d in zip(self.dtensors, dtensors):
                locals_[i] = d._local_tensor
        tensor = sys.modules["torch"].Tensor
        # A nested tensor over the same buffer has no shape or strides (reading them raises,
        # and aborts the guards): told apart first.
        try:
            ptrs = list(map(tensor.data_ptr, locals_))
        except RuntimeError:  # a tensor without storage (sparse, ...): prepared anew, named
            return None
        if ptrs != self.ptrs or any(map(_IS_NESTED, locals_)):
            return None
        if self.guards is not None:
            return locals_ if self.guards.check(*locals_) else None
        if (list(map(_DTYPE, locals_)) != self.dtypes or
                list(map(_SHAPE, locals_)) != self.shapes or
                not all(map(tensor.is_contiguous, locals_)) or not all(map(_IS_CPU, locals_)) or
                any(map(tensor.is_conj, locals_)) or any(map(tensor.is_neg, locals_))):
            return None  # (a conjugate or negative view of the same memory reads differently)
        return locals_


def _reuse(p: Prepared, cached: Prepared) -> bool:
    """Takes `cached`'s engine StateDict into `p` when every tensor leaf matches."""
    owners = cached.signatures.match(p.flat.tensors)
    if owners is None:
        return False
    p.sd, p.owners, p.signatures = cached.sd, owners, cached.signatures
    return True


def _build(p: Prepared, for_load: bool, load_as: Optional[Dict[str, Any]] = None) -> None:
    p.sd = _dcp.StateDict()
    sigs: Optional[list] = []
    torch = sys.modules.get("torch")
    for fqn, leaf in p.flat.leaves.items():
        if not is_tensor(leaf):
            continue
        if for_load and torch is not None and isinstance(leaf, torch.Tensor):
            from .torch import is_meta, materialize

            if is_meta(leaf):  # a model built on meta: the load allocates the entry
                leaf = p.replacements[fqn] = materialize(leaf)
                sigs = None
        chunks = host_chunks(fqn, leaf, for_load, load_as.get(fqn) if load_as else None)
        if not chunks:
            p.absent.append(fqn)
        for chunk in chunks:
            p.sd.add_tensor(fqn, chunk.data_ptr, chunk.dtype, chunk.shape,
                            chunk.global_shape, chunk.offsets)
            p.owners.append(chunk.owner)
            if chunk.write_back is not None:
                p.write_backs.append(chunk.write_back)
        if sigs is not None:
            got = _signature(leaf)
            if got is None or len(chunks) != 1 or chunks[0].owner is not got[0]:
                sigs = None  # a staged copy, several chunks or none: not reusable
            else:
                sigs.append(got)
    p.signatures = None if sigs is None else Signatures(p.flat.tensors, sigs)


def prepare(state_dict: Mapping, for_load: bool, allow_pickle: bool = False,
            load_as: Optional[Dict[str, Any]] = None) -> Prepared:
    """The engine StateDict of `state_dict`; pass it to release() after the engine call.
    `load_as`: fqn -> torch dtype to load through (the stored one, where it differs)."""
    # Thousands of small objects (paths, names) and no cycles: a collection of the whole
    # heap in the middle (it holds the model) would cost more than the preparation.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _prepare(state_dict, for_load, allow_pickle, load_as)
    finally:
        if enabled:
            gc.enable()


def _prepare(state_dict: Mapping, for_load: bool, allow_pickle: bool,
             load_as: Optional[Dict[str, Any]]) -> Prepared:
    p = Prepared(state_dict)
    names = tuple(p.flat.leaves)
    if load_as:
        _build(p, for_load, load_as)
        _add_values(p, for_load, allow_pickle)
        return p
    # The nesting a save records (metadata paths): part of what a reused preparation matches.
    p.layout = None if for_load else p.flat.layout()
    with _CACHE_LOCK:  # several state dicts may share names (a model and its reshard copy)
        candidates = [k for k in _CACHE if k[0] == for_load and k[1] == names]
        cached = [_CACHE.pop(k) for k in candidates]
    reused = any(c.layout == p.layout and _reuse(p, c) for c in cached)
    if not reused:
        _build(p, for_load)
    with _CACHE_LOCK:  # the ones not taken go back
        for c in cached:
            if c.sd is not p.sd:
                _CACHE[c.cache_key] = c
    p.cache_key = (for_load, names, id(p.sd))
    _add_values(p, for_load, allow_pickle)
    if not reused and not for_load:
        fqns, paths = _paths.encode_all(p.flat)
        if p.absent:  # the ranks that hold chunks of them record their paths
            absent = set(p.absent)
            kept = [(f, x) for f, x in zip(fqns, paths) if f not in absent]
            fqns, paths = [f for f, _ in kept], [x for _, x in kept]
        p.sd.set_paths(fqns, paths)
    return p


def _add_values(p: Prepared, for_load: bool, allow_pickle: bool) -> None:
    if not for_load:
        from ._metadata import per_rank_value

        for fqn in p.flat.values:
            if ".__dcp_rank_" in fqn and per_rank_value(fqn) is not None:
                raise invalid_argument(
                    f"'{fqn}': names ending in .__dcp_rank_<r> hold values saved per rank "
                    "(a value that differs between ranks is kept per rank by itself): "
                    "rename the entry")
    for fqn in p.flat.values:
        leaf = p.flat.leaves[fqn]
        if for_load:
            p.sd.add_bytes(fqn, b"")  # also clears what a previous load left in a reused one
        else:
            p.sd.add_bytes(fqn, _values.encode(fqn, leaf, allow_pickle))


def release(p: Optional[Prepared]) -> None:
    """After the engine call: a reusable preparation goes back to the cache, without the
    tensors it referenced."""
    if p is None or p.signatures is None or p.cache_key is None:
        return
    kept = Prepared.__new__(Prepared)
    kept.sd, kept.signatures, kept.cache_key, kept.layout = (p.sd, p.signatures, p.cache_key,
                                                             p.layout)
    with _CACHE_LOCK:
        _CACHE[p.cache_key] = kept
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)


def failure_text(failure: BaseException) -> tuple:
    """(code, message) of a preparation's failure, as other ranks are told of it. Only a
    DcpError's code is kept (SystemExit, HTTPError and others have `code`s of other kinds)."""
    code = getattr(failure, "code", None) if isinstance(failure, DcpError) else None
    try:
        text = str(failure)
    except Exception:  # a __str__ that fails must not keep the other ranks waiting
        text = "(no message)"
    message = text if isinstance(failure, DcpError) else f"{type(failure).__name__}: {text}"
    return (code if isinstance(code, str) else "INVALID_ARGUMENT"), message


def _agree(comm: Any, failure: Optional[BaseException]) -> None:
    """Every rank learns every rank's preparation outcome; raises the same error on each.
    (A non-tensor value that differs between the ranks holding it is the engine's check,
    inside the save's first exchange.)"""
    mine = json.dumps(failure_text(failure) if failure is not None else None).encode()
    everyone = [json.loads(b) for b in _boundary.call(comm, _dcp.all_gather, comm, mine)]
    for rank, doc in enumerate(everyone):  # the first failure, the same error on every rank
        if doc is not None:
            raise error(doc[0], f"rank {rank}: {doc[1]}") from failure


def prepare_on_every_rank(state_dict: Mapping, comm: Any, for_load: bool, agree: bool,
                          allow_pickle: bool = False,
                          precheck: Optional[Callable[[], None]] = None,
                          load_as: Optional[Dict[str, Any]] = None) -> Prepared:
    """prepare() (after `precheck`), with a failure on any rank raised on every rank (none
    then enters the engine) when `agree`."""
    failure: Optional[BaseException] = None
    p = None
    try:
        if precheck is not None:
            precheck()
        p = prepare(state_dict, for_load, allow_pickle, load_as)
    except Exception as e:  # any rank's failure must reach every rank, not hang them
        failure = e
    if agree and comm.size > 1:
        _agree(comm, failure)
    if failure is not None:
        raise failure
    return p


def finish_load(p: Prepared, allow_pickle: bool = False, device: Any = None) -> None:
    """After the engine filled `p.sd`: staged chunks copied back into their tensors, autograd
    told of the in-place writes, non-tensor values replaced, tensors allocated for meta
    templates put in their place (moved to `device` if given), Stateful objects loaded."""
    torch = sys.modules.get("torch")
    for write_back in p.write_backs:
        write_back()  # a copy_: autograd sees it
    bump = getattr(getattr(getattr(torch, "autograd", None), "graph", None),
                   "increment_version", None)
    if bump is not None:
        # As copy_ would: a saved-for-backward use of a loaded tensor now fails. The leaves
        # and the local tensors of DTensors (a plain tensor, its own owner, is bumped twice:
        # a version only has to change).
        tensor = torch.Tensor
        bump([t for t in p.owners + p.flat.tensors if isinstance(t, tensor)])
    loaded: Dict[str, Any] = {}
    for fqn in p.flat.values:
        data = p.sd.bytes_of(fqn)
        if data:  # empty: skipped by a partial load (a stored value is never empty)
            loaded[fqn] = _values.decode(fqn, data, allow_pickle)
    for fqn, tensor in p.replacements.items():
        loaded[fqn] = tensor if device is None else tensor.to(device)
    replaced = set_leaves(p.state, p.flat, loaded)
    for key in p.stateful:
        p.original[key].load_state_dict(p.state[key])
    for key in replaced.difference(p.stateful):
        if p.state[key] is not p.original[key]:  # changed in place: nothing to put back
            p.original[key] = p.state[key]
