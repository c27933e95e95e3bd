"""The "pallas" backend: `posenc_jax.model.kernels.flash_attention`, the flash-attention kernel
(Triton on GPUs, Mosaic on TPUs, interpret mode on CPU, by the platform lowered for) that
evaluates an `ElementwiseBias` and applies a `KernelRotary` rotation in-kernel. "auto" picks
it first on GPUs and TPUs. The kernel's own refusals come from `kernels.check_supported`."""

from __future__ import annotations

import jax

from posenc_jax.encodings.base import Encoding
from posenc_jax.model import kernels
from posenc_jax.model.backends.registry import Backend, Inputs, Shapes, register

__all__ = ["BACKEND", "NAME"]

NAME = "pallas"


def _pow2(n: int) -> int:
    """The largest power of two <= n (interpret-mode blocks)."""
    return 1 << (max(int(n), 1).bit_length() - 1)


def _check(encoding: Encoding, shapes: Shapes | None) -> str | None:
    del shapes  # the kernel's shape-aware check replaces this once it has one
    try:
        kernels.check_supported(encoding)
    except ValueError as err:
        return str(err)
    return None


def host_platform() -> str | None:
    """The accelerator this process runs on ("cuda", "tpu"), or None on a CPU host."""
    return {"gpu": "cuda", "tpu": "tpu"}.get(jax.default_backend())


def _lowers(encoding: Encoding, shapes: Shapes, platform: str) -> str | None:
    """The kernel's shape-aware check (`kernels.unsupported_reason`: declared capabilities,
    then a cached trial lowering) for the accelerator this process runs on, so "auto" never
    picks a kernel that cannot lower there (e.g. FIRE under Triton). Other platforms (a CPU
    host cross-lowering for cuda or tpu) are not trial-lowered on every trace: 1-15 s each."""
    if platform != host_platform():
        return None
    reason = kernels.unsupported_reason(
        encoding, platform=platform, head_dim=shapes.head_dim, num_heads=shapes.heads,
        num_kv_heads=shapes.kv_heads, window=shapes.window)
    return None if reason is None else f"attention={NAME!r}: {reason}"


def _call(x: Inputs):
    return kernels.flash_attention(
        x.q, x.k, x.v, encoding=x.encoding, params=x.params, q_positions=x.q_positions,
        k_positions=x.k_positions, q_segment_ids=x.q_segment_ids,
        k_segment_ids=x.k_segment_ids, k_mask=x.k_mask, causal=x.causal, rotation=x.rotation,
        block_q=_pow2(x.block_q), block_k=_pow2(x.block_k), blocks=x.kernel_blocks, window=x.window)


BACKEND = register(Backend(
    name=NAME, call=_call,
    summary="Pallas flash attention: elementwise bias and RoPE in-kernel (Triton, Mosaic)",
    bias=frozenset({"elementwise"}), platforms=frozenset({"cpu", "cuda", "tpu"}),
    rotates_inside=True, sliding_window=True, check=_check, lowers=_lowers, auto_priority=0,
    auto_platforms=frozenset({"cuda", "tpu"})))
