"""One rule for the values of every checkpoint tensor, whatever the file format.

    dtype = float_dtype(file, name, "F8_E4M3")        # ml_dtypes.float8_e4m3fn
    w = checked_weights(file, name, array)            # float32, finite, or ValueError

A weight is a floating-point tensor with finite values. `float_dtype` maps a format's dtype
name (safetensors' "F32", "BF16", "F8_E4M3", ...; GGUF's "F32", "F16", "BF16", "Q4_1", ...)
to what reads it, and refuses integer and boolean tensors by name: a checkpoint whose
weights are ints or bools is not a model (an index table or a mask saved by mistake). The
packed sub-byte floats (F4, F6_*) and the scale-only F8_E8M0 are refused by name too.
Dtypes numpy has no scalar type for (bfloat16, the float8s) are read through `ml_dtypes`,
which jax installs. `checked_weights` turns any of them into float32 (exact: every float8,
float16 and bfloat16 value is a float32) and refuses NaN and infinity, counting them. Every
message starts with the file and the tensor (`checkpoint.tensor_error`).
"""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np

from posenc_jax.pretrained.checkpoint import tensor_error

__all__ = ["NEEDS_RAW", "SAFETENSORS_FLOATS", "checked_weights", "float_dtype", "raw_safetensors"]

#: safetensors dtype name -> numpy dtype (ml_dtypes for those numpy lacks).
SAFETENSORS_FLOATS = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
#: Dtypes the safetensors package cannot hand to numpy (it asks numpy for them by name).
NEEDS_RAW = frozenset({"F8_E4M3", "F8_E5M2"})
_GGUF_INTEGERS = frozenset({"I8", "I16", "I32", "I64"})
_SAFETENSORS_NOT_FLOAT = frozenset({"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64",
                                    "I64", "C64"})
#: Floating-point safetensors dtypes with no reader here (packed sub-byte or scale-only).
_SAFETENSORS_UNREAD = frozenset({"F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"})


def float_dtype(path: Any, name: str, code: str, *, gguf: bool = False) -> np.dtype | None:
    """The numpy dtype a safetensors tensor of dtype `code` reads as (`gguf=False`), or None
    for a GGUF type (`gguf=True`: `gguf.quants.dequantize` reads every float and quantised
    type). ValueError naming the file, the tensor and the dtype for integer, boolean or
    unknown dtypes."""
    if gguf:
        if code in _GGUF_INTEGERS:
            raise tensor_error(path, name, f"has integer GGUF type {code}; weights must be "
                               "floating point (F32, F16, BF16 or a quantised type)")
        return None
    if code in SAFETENSORS_FLOATS:
        return SAFETENSORS_FLOATS[code]
    what = ("is not a floating-point type" if code in _SAFETENSORS_NOT_FLOAT else
            "is a floating-point type this reader does not read" if code in _SAFETENSORS_UNREAD
            else "is an unknown dtype")
    raise tensor_error(path, name, f"dtype {code} {what}; weights must be one of "
                       f"{', '.join(SAFETENSORS_FLOATS)}")


def checked_weights(path: Any, name: str, value: np.ndarray, *, also: str = "") -> np.ndarray:
    """`value` as a float32 array; ValueError naming the file and the tensor (`also`: more of
    its name, e.g. the GGUF one) when it is not floating point or holds NaN / infinity."""
    label = f"{name!r}{also}"
    if not np.issubdtype(value.dtype, np.floating) and value.dtype not in (
            SAFETENSORS_FLOATS.values()):
        raise ValueError(f"{path}: tensor {label}: dtype {value.dtype} is not floating point")
    out = np.asarray(value, dtype=np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        nan = int(np.isnan(out).sum())
        raise ValueError(f"{path}: tensor {label}: holds {int(bad.sum())} non-finite values "
                         f"({nan} NaN, {int(bad.sum()) - nan} infinite) of {out.size}; a "
                         "checkpoint's weights must be finite (corrupt or diverged?)")
    return out


def raw_safetensors(file: Any, name: str, dtype: np.dtype) -> np.ndarray:
    """Tensor `name` of safetensors `file` read from its bytes as `dtype` (for NEEDS_RAW):
    the header is a little-endian u64 length and a JSON object {name: {dtype, shape,
    data_offsets: [begin, end]}} relative to the end of the header."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        entry = json.loads(f.read(size))[name]
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * dtype.itemsize:
            raise tensor_error(file, name, f"holds {end - begin} bytes, {count} values of "
                               f"{dtype} need {count * dtype.itemsize}")
        f.seek(8 + size + begin)
        data = f.read(end - begin)
    return np.frombuffer(data, dtype=dtype).reshape(shape)
