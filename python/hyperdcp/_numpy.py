"""numpy arrays as chunks (a view of the array's memory; one copy when not C-contiguous)."""

from typing import Any

import numpy as np

from ._chunk_types import HostChunk
from ._errors import invalid_argument

_DTYPES = {
    np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16", np.dtype(np.int16): "I16", np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32", np.dtype(np.uint64): "U64", np.dtype(np.int64): "I64",
    np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
    np.dtype(np.complex64): "C64", np.dtype(np.complex128): "C128",
}


def numpy_chunk(fqn: str, arr: Any, for_load: bool) -> HostChunk:
    dtype = _DTYPES.get(arr.dtype) if arr.dtype.isnative else None
    if dtype is None:
        raise invalid_argument(f"'{fqn}': numpy dtype {arr.dtype} has no dcp dtype")
    if for_load and not arr.flags.writeable:
        raise invalid_argument(f"'{fqn}': the numpy array to load into is read-only")
    host, write_back = arr, None
    if not arr.flags.c_contiguous:
        host = np.ascontiguousarray(arr)
        if for_load:
            def write_back(dst=arr, src=host):
                dst[...] = src
    return HostChunk(owner=host, data_ptr=host.ctypes.data, dtype=dtype,
                     shape=list(host.shape), global_shape=list(host.shape),
                     offsets=[0] * host.ndim, write_back=write_back)
