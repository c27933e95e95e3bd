"""The "pallas" backend: `posenc_jax.model.kernels.flash_attention`, the flash-attention kernel
(Triton on GPUs, Mosaic on TPUs, interpret mode on CPU, by the platform lowered for) that
evaluates an `ElementwiseBias` and applies a `KernelRotary` rotation in-kernel, with windows,
chunks, sink tokens and learned sinks (forward and backward). "auto" picks it first on GPUs
and TPUs, for `attend` and for context parallelism's steps (`call_lse`). What it computes is
this record's fields (an elementwise bias, no value term or block transform); whether it
lowers at given shapes on the host's accelerator is `_lowers` (`kernels.unsupported_reason`).
"""

from __future__ import annotations

from posenc_jax.encodings.base import Encoding
from posenc_jax.model import kernels
from posenc_jax.model.backends import registry
from posenc_jax.model.backends.registry import Backend, Inputs, Shapes, register

__all__ = ["BACKEND", "NAME", "pow2"]

NAME = "pallas"


def pow2(n: int) -> int:
    """The largest power of two <= n (interpret-mode blocks)."""
    return 1 << (max(int(n), 1).bit_length() - 1)


def _lowers(encoding: Encoding, shapes: Shapes, platform: str) -> str | None:
    """The kernel's shape-aware check (`kernels.unsupported_reason`: a cached trial lowering)
    for the accelerator this process runs on (`registry.host_platform`), so "auto" never picks
    a kernel that cannot lower there (e.g. FIRE under Triton). Other platforms (a CPU host
    cross-lowering for cuda or tpu) are not trial-lowered on every trace: 1-15 s each."""
    if platform != registry.host_platform():
        return None
    reason = kernels.unsupported_reason(
        encoding, platform=platform, head_dim=shapes.head_dim, num_heads=shapes.heads,
        num_kv_heads=shapes.kv_heads, window=shapes.window, chunk_size=shapes.chunk_size,
        sinks=shapes.sinks, sink_tokens=shapes.sink_tokens)
    return (None if reason is None else
            f"attention={NAME!r}: {reason}; use attention='auto', 'blockwise' or 'dense'")


def _kwargs(x: Inputs) -> dict:
    return {"encoding": x.encoding, "params": x.params, "q_positions": x.q_positions,
            "k_positions": x.k_positions, "q_segment_ids": x.q_segment_ids,
            "k_segment_ids": x.k_segment_ids, "k_mask": x.k_mask, "causal": x.causal,
            "rotation": x.rotation, "block_q": pow2(x.block_q), "block_k": pow2(x.block_k),
            "blocks": x.kernel_blocks, "window": x.window, "chunk_size": x.chunk_size,
            "sink_tokens": x.sink_tokens, "sinks": x.sinks}


def _call(x: Inputs):
    return kernels.flash_attention(x.q, x.k, x.v, **_kwargs(x))


def _call_lse(x: Inputs):
    return kernels.flash_attention(x.q, x.k, x.v, **_kwargs(x), return_lse=True)


BACKEND = register(Backend(
    name=NAME, call=_call, call_lse=_call_lse, bias=frozenset({"elementwise"}),
    platforms=frozenset({"cpu", "cuda", "tpu"}), rotates_inside=True, sliding_window=True,
    chunked=True, sinks=True, sink_tokens=True, lowers=_lowers, auto_priority=0,
    auto_platforms=frozenset({"cuda", "tpu"})))
