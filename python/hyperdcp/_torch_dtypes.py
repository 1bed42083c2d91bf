"""torch dtypes and dcp's dtype names (safetensors spelling)."""

import torch

from ._errors import invalid_argument

_NAMES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16",
    "uint32": "U32", "int32": "I32", "uint64": "U64", "int64": "I64", "float16": "F16",
    "bfloat16": "BF16", "float32": "F32", "float64": "F64", "complex64": "C64",
    "complex128": "C128", "complex32": "C32",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
}
# torch dtype <-> dcp dtype name, for the dtypes this torch has.
TO_DCP = {getattr(torch, n): d for n, d in _NAMES.items() if hasattr(torch, n)}
FROM_DCP = {d: t for t, d in TO_DCP.items()}


def dtype_name(fqn: str, dtype: "torch.dtype") -> str:
    try:
        return TO_DCP[dtype]
    except KeyError:
        raise invalid_argument(f"'{fqn}': torch dtype {dtype} has no dcp dtype") from None
