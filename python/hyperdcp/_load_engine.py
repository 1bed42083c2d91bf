"""A load of a hyperdcp checkpoint directory into a state dict, below torch's keywords: what
`hyperdcp.load` runs once it knows the directory, and what torch's reader of hyperdcp
checkpoints (`_torch_reader`) runs for its requests."""

import logging
import sys
from typing import Any, Dict, Optional, Tuple

from . import _boundary, _dcp
from ._errors import DcpError
from ._prepare import Prepared, finish_load, prepare_on_every_rank, release


def load_directory(state_dict: Any, directory: str, comm: Any, *, broadcast: bool = True,
                   allow_partial: bool = False, strip_prefix: str = "", add_prefix: str = "",
                   verify_checksums: bool = True, max_open_files: int = 8,
                   allow_pickle: bool = False, device: Any = None,
                   max_broadcast_buffer_bytes: Optional[int] = None,
                   broadcast_cached: bool = False) -> Tuple[Any, Prepared]:
    """Loads `directory` into `state_dict` over `comm` (every rank calls it); the engine's
    result and the prepared state (its Python timings). Options as `hyperdcp.load`'s."""
    if max_broadcast_buffer_bytes is not None and not max_broadcast_buffer_bytes > 0:
        raise ValueError("max_broadcast_buffer_bytes must be positive, not "
                         f"{max_broadcast_buffer_bytes!r}")
    args = (directory, comm, broadcast, allow_partial, strip_prefix, add_prefix,
            verify_checksums, max_open_files, bool(broadcast_cached))
    if max_broadcast_buffer_bytes is not None:  # else the binding's: LoadOptions' default
        args += (int(max_broadcast_buffer_bytes),)
    p = prepare_on_every_rank(state_dict, comm, for_load=True, agree=True)
    try:
        try:
            result = _boundary.call(comm, _dcp.load, p.sd, *args)
        except DcpError as e:
            # Stored in another dtype than the template's: torch DCP casts, and so do we.
            # The engine refuses before reading anything, with the same error on every rank,
            # so every rank retries, loading those entries through staged copies.
            load_as = _stored_dtypes_differing(e, directory, p, strip_prefix, add_prefix)
            if not load_as:
                raise
            release(p)
            p = prepare_on_every_rank(state_dict, comm, for_load=True, agree=True,
                                      load_as=load_as)
            result = _boundary.call(comm, _dcp.load, p.sd, *args)
        finish_load(p, allow_pickle, device)
    finally:
        release(p)
    for line in result.warnings:  # values saved per rank, of which this rank got another's
        logging.getLogger("hyperdcp").warning("hyperdcp: load from %s: %s", directory, line)
    return result, p


def _stored_dtypes_differing(e: DcpError, directory: str, p: Prepared, strip_prefix: str,
                             add_prefix: str) -> Dict[str, Any]:
    """fqn -> the stored torch dtype, for the tensors of `p` stored in another dtype."""
    if "dtype mismatch" not in str(e) or "torch" not in sys.modules:
        return {}
    from ._metadata import read_metadata
    from ._torch_dtypes import FROM_DCP

    out: Dict[str, Any] = {}
    stored = read_metadata(directory).tensors
    for fqn, leaf in p.flat.leaves.items():
        name = fqn
        if add_prefix and name.startswith(add_prefix):  # template name -> stored name
            name = strip_prefix + name[len(add_prefix):]
        elif strip_prefix:
            name = strip_prefix + name
        info = stored.get(name) or stored.get(fqn)
        dtype = getattr(leaf, "dtype", None)
        if info is not None and dtype is not None and FROM_DCP.get(info.dtype) not in (None,
                                                                                    dtype):
            out[fqn] = FROM_DCP[info.dtype]
    return out
