"""The GGUF container read directly: header, metadata and tensor table, data memory-mapped.

GGUF (versions 2 and 3, little-endian): magic "GGUF", version u32, tensor count u64, metadata
count u64; the metadata as (key string, type u32, value); then per tensor (name string, n_dims
u32, dims u64 x n_dims innermost first, ggml type u32, offset u64); the data starts at the next
multiple of `general.alignment` (32 when absent). A string is a u64 length and UTF-8 bytes.

`gguf.GGUFReader` builds a numpy array per metadata item, which for Gemma 3's 262,144-entry
vocabulary takes a minute on a busy 2-core machine; this parser takes about a second, names the
tensor a truncated file cuts short, and leaves dequantising to `gguf.quants.dequantize`.
Metadata values: int, float (a float32 value as Python float, as transformers reads it), bool,
str, list[str], or a 1-D numpy array for numeric arrays.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

__all__ = ["GGUFFile", "TensorInfo", "read_gguf"]

_MAGIC = b"GGUF"
# type id -> (struct format, numpy dtype) for the scalar types; 8 = string, 9 = array.
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
            4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
            10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9
TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32",
              6: "float32", 7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64",
              12: "float64"}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: `shape` outermost first (numpy / Hugging Face order); `data` the
    raw bytes as uint8 [..., bytes per row], as gguf.quants.dequantize takes them."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    data: np.ndarray


@dataclasses.dataclass(frozen=True)
class GGUFFile:
    """`types[key]`: the GGUF value type of `fields[key]` ("uint32", "float32", "string",
    "array[string]", ...), as `gguf_metadata` checks it."""

    version: int
    fields: dict[str, Any]
    tensors: list[TensorInfo]
    types: dict[str, str] = dataclasses.field(default_factory=dict)


class _Cursor:
    def __init__(self, buf: mmap.mmap, where: str):
        self.buf, self.pos, self.where = buf, 0, where

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(f"{self.where}: the file ends inside its header at byte {self.pos} "
                             "(truncated?)")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.where}: a {n}-byte string at byte {self.pos} runs past the "
                             "end of the file (truncated or corrupt)")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, type_id: int, key: str) -> Any:
        if type_id in _SCALARS:
            return self.take(_SCALARS[type_id][0])
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            sub, count = self.take("<I"), self.take("<Q")
            if sub == _STRING:
                return [self.string() for _ in range(count)]
            if sub in _SCALARS:
                dtype = np.dtype(_SCALARS[sub][1]).newbyteorder("<")
                end = self.pos + count * dtype.itemsize
                if end > len(self.buf):
                    raise ValueError(f"{self.where}: metadata {key!r} runs past the end of the "
                                     "file (truncated?)")
                out = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos = end
                return out
            return [self.value(sub, key) for _ in range(count)]  # arrays of arrays
        raise ValueError(f"{self.where}: metadata {key!r} has unknown GGUF value type {type_id} "
                         "(corrupt file?)")


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse GGUF file `path`; ValueError naming the file (and tensor) when it is not GGUF,
    is truncated, or is inconsistent."""
    where = os.fspath(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError(f"{where}: empty file, not GGUF")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if buf[:4] != _MAGIC:
        raise ValueError(f"{where}: not a GGUF file (starts with {bytes(buf[:4])!r}, "
                         f"expected {_MAGIC!r})")
    cur = _Cursor(buf, where)
    cur.pos = 4
    version = cur.take("<I")
    if version not in (2, 3):
        raise ValueError(f"{where}: GGUF version {version} is not supported (2 or 3; a "
                         "big-endian file reads as a huge version)")
    n_tensors, n_fields = cur.take("<Q"), cur.take("<Q")
    fields: dict[str, Any] = {}
    types: dict[str, str] = {}
    for _ in range(n_fields):
        key = cur.string()
        if key in fields:
            raise ValueError(f"{where}: metadata key {key!r} appears twice (corrupt file?)")
        type_id = cur.take("<I")
        start_of_value = cur.pos
        fields[key] = cur.value(type_id, key)
        types[key] = _type_name(buf, start_of_value, type_id)
    table, seen = [], set()
    for _ in range(n_tensors):
        name = cur.string()
        if name in seen:
            raise ValueError(f"{where}: tensor {name!r} appears twice in the tensor table "
                             "(a GGUF file names each tensor once)")
        seen.add(name)
        dims = [cur.take("<Q") for _ in range(cur.take("<I"))]
        table.append((name, tuple(reversed(dims)), cur.take("<I"), cur.take("<Q")))
    align = fields.get("general.alignment", 32)
    if (isinstance(align, bool) or not isinstance(align, int) or align <= 0
            or align & (align - 1)):
        raise ValueError(f"{where}: metadata 'general.alignment' must be a power of two >= 1 "
                         f"(the GGUF spec; 32 when absent), got {align!r}")
    start = -(-cur.pos // align) * align
    return GGUFFile(version, fields, [_tensor(buf, where, start, *row) for row in table], types)


def _type_name(buf: mmap.mmap, pos: int, type_id: int) -> str:
    """"uint32", ..., or "array[<element type>]" (read back from the value's first bytes)."""
    if type_id != _ARRAY:
        return TYPE_NAMES[type_id]
    (sub,) = struct.unpack_from("<I", buf, pos)
    return f"array[{TYPE_NAMES.get(sub, sub)}]"


def _tensor(buf: mmap.mmap, where: str, start: int, name: str, shape: tuple[int, ...],
            type_id: int, offset: int) -> TensorInfo:
    try:
        ggml_type = GGMLQuantizationType(type_id)
        block, type_size = GGML_QUANT_SIZES[ggml_type]
    except (ValueError, KeyError):
        raise ValueError(f"{where}: tensor {name!r}: unknown ggml type {type_id}") from None
    n = int(np.prod(shape, dtype=np.int64))
    if not shape or shape[-1] % block:
        raise ValueError(f"{where}: tensor {name!r}: shape {shape} does not fit "
                         f"{ggml_type.name} blocks of {block}")
    n_bytes = n // block * type_size
    begin = start + offset
    if begin + n_bytes > len(buf):
        raise ValueError(f"{where}: tensor {name!r} ends at byte {begin + n_bytes} but the file "
                         f"has {len(buf)} bytes (truncated?)")
    data = np.frombuffer(buf, dtype=np.uint8, count=n_bytes, offset=begin)
    return TensorInfo(name, shape, ggml_type,
                      data.reshape(quant_shape_to_byte_shape(shape, ggml_type)))
