"""Kernel block sizes: a validated, frozen value per platform and per pass, defaults by head dim.

`GpuBlocks` (Triton) and `TpuBlocks` (Mosaic) name the blocks of each pass: the forward's
(`block_q`, `block_k`), the dq kernel's (`block_q_dq`, `block_k_dq`) and the dk/dv kernel's
(`block_q_dkv`, `block_k_dkv`); the GPU value also carries Triton's `num_warps` and
`num_stages`. Every field is checked on construction (TypeError for a non-int, ValueError
naming the field, its value and what is allowed). `default_blocks(platform, head_dim)` gives
the defaults, chosen by head dim (they are starting points: the device run sweeps them).

A block larger than the padded sequence is cut to it: the kernel uses gcd(block, padded
length), a power of two (lengths are padded to whole 128-blocks, or one short power of two).

`KernelBlocks` is what a config holds: per-platform overrides of some fields, resolved against
the head dim's defaults when the kernel runs (`KernelBlocks.resolve`); `kernel_blocks(value)`
builds it from None, a dict `{"gpu": {...}, "tpu": {...}}` or block values.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

__all__ = ["GpuBlocks", "KernelBlocks", "TpuBlocks", "default_blocks", "kernel_blocks"]

_BLOCKS = ("block_q", "block_k", "block_q_dq", "block_k_dq", "block_q_dkv", "block_k_dkv")


def _int(cls: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{cls}.{field} must be an int, got {field}={value!r}")
    return value


def _pow2(cls: str, field: str, value: Any, low: int, high: int, multiple: int = 1) -> None:
    value = _int(cls, field, value)
    if value < low or value > high or value & (value - 1) or value % multiple:
        extra = f" and a multiple of {multiple}" if multiple > 1 else ""
        raise ValueError(f"{cls}.{field} must be a power of two in [{low}, {high}]{extra}, "
                         f"got {field}={value!r}")


@dataclasses.dataclass(frozen=True)
class GpuBlocks:
    """Triton blocks: powers of two in [16, 256] (Triton's dot needs >= 16 rows), warps and
    pipeline stages."""

    block_q: int = 64
    block_k: int = 64
    block_q_dq: int = 64
    block_k_dq: int = 64
    block_q_dkv: int = 64
    block_k_dkv: int = 64
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for f in _BLOCKS:
            _pow2("GpuBlocks", f, getattr(self, f), 16, 256)
        if _int("GpuBlocks", "num_warps", self.num_warps) not in (1, 2, 4, 8, 16):
            raise ValueError(f"GpuBlocks.num_warps must be one of 1, 2, 4, 8, 16, got "
                             f"num_warps={self.num_warps!r}")
        if not 1 <= _int("GpuBlocks", "num_stages", self.num_stages) <= 8:
            raise ValueError(f"GpuBlocks.num_stages must be in [1, 8], got "
                             f"num_stages={self.num_stages!r}")


@dataclasses.dataclass(frozen=True)
class TpuBlocks:
    """Mosaic blocks: query blocks powers of two in [8, 2048]; key blocks lane-dense, powers
    of two in [128, 2048] (a short sequence uses its whole padded length instead)."""

    block_q: int = 128
    block_k: int = 128
    block_q_dq: int = 128
    block_k_dq: int = 128
    block_q_dkv: int = 128
    block_k_dkv: int = 128

    def __post_init__(self):
        for f in _BLOCKS:
            if f.startswith("block_k"):
                _pow2("TpuBlocks", f, getattr(self, f), 128, 2048)
            else:
                _pow2("TpuBlocks", f, getattr(self, f), 8, 2048)


_TYPES = {"gpu": GpuBlocks, "tpu": TpuBlocks}


def default_blocks(platform: str, head_dim: int) -> GpuBlocks | TpuBlocks:
    """The defaults for `platform` ("gpu" or "tpu") at head dim D. GPU: the accumulator
    [block_q, D] float32 lives in registers, so wider heads take smaller blocks and more
    warps (D <= 64: 128 x 64, 4 warps, 3 stages; D <= 128: 64 x 64, 8 warps; wider: 64 x 32,
    backward 32 x 32, 8 warps). TPU: 128 x 128 (the MXU tile) for every D."""
    if platform == "tpu":
        return TpuBlocks()
    if platform != "gpu":
        raise ValueError(f"platform must be 'gpu' or 'tpu', got platform={platform!r}")
    if head_dim <= 64:
        return GpuBlocks(block_q=128, block_k=64, num_warps=4, num_stages=3)
    if head_dim <= 128:
        return GpuBlocks(num_warps=8)
    return GpuBlocks(block_q=64, block_k=32, block_q_dq=32, block_k_dq=32, block_q_dkv=32,
                     block_k_dkv=32, num_warps=8)


@dataclasses.dataclass(frozen=True)
class KernelBlocks:
    """Per-platform overrides (sorted (field, value) pairs), resolved against the defaults
    of the head dim at run time. Hashable: a config field and a kernel's static argument."""

    gpu: tuple = ()
    tpu: tuple = ()

    def resolve(self, platform: str, head_dim: int) -> GpuBlocks | TpuBlocks:
        """The blocks for `platform` at head dim D: its defaults with the overrides."""
        return dataclasses.replace(default_blocks(platform, head_dim),
                                   **dict(getattr(self, platform)))


def _overrides(platform: str, value: Any) -> tuple:
    cls = _TYPES[platform]
    if isinstance(value, cls):
        value = dataclasses.asdict(value)
    if not isinstance(value, Mapping):
        raise TypeError(f"kernel_blocks[{platform!r}] must be a dict of {cls.__name__} fields "
                        f"or a {cls.__name__}, got {value!r}")
    fields = [f.name for f in dataclasses.fields(cls)]
    for key in value:
        if key not in fields:
            raise ValueError(f"kernel_blocks[{platform!r}] has unknown field {key!r}; valid: "
                             f"{', '.join(fields)}")
    cls(**value)  # validates each given field (the others are the defaults)
    for head_dim in (64, 128, 256):  # and the combination with every default
        dataclasses.replace(default_blocks(platform, head_dim), **value)
    return tuple(sorted(dict(value).items()))


def kernel_blocks(value: Any) -> KernelBlocks | None:
    """None, a `KernelBlocks`, a `GpuBlocks` / `TpuBlocks`, or a dict keyed by "gpu" / "tpu"
    (values: dicts of fields or block values) -> a validated `KernelBlocks` (None stays)."""
    if value is None or isinstance(value, KernelBlocks):
        return value
    for platform, cls in _TYPES.items():
        if isinstance(value, cls):
            return KernelBlocks(**{platform: _overrides(platform, value)})
    if not isinstance(value, Mapping):
        raise TypeError(f"kernel_blocks must be None, a dict keyed by 'gpu' / 'tpu', or a "
                        f"GpuBlocks / TpuBlocks, got {value!r}")
    for key in value:
        if key not in _TYPES:
            raise ValueError(f"kernel_blocks has unknown platform {key!r}; valid: 'gpu', 'tpu'")
    return KernelBlocks(**{p: _overrides(p, v) for p, v in value.items()})
