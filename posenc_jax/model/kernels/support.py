"""`unsupported_reason`: whether the kernel can run a given encoding at given shapes on a
platform, and if not, why -- what the attention registry asks so that "auto" never picks a
kernel that cannot lower and an explicit "pallas" fails at config time naming the shape.

The answer comes in two steps: the declared capabilities (`flash.check_supported`: an
elementwise bias, no value term or block transform; the head counts), then -- the shape-aware
part -- a trial lowering of the forward and backward kernels for that platform on abstract
arrays at the given head dim, head counts, causality and window (L = 256, two blocks of
every pass; nothing is allocated). A lowering error (Triton's power-of-two rule, an operation
a lowering lacks, a Mosaic tiling rule) becomes the reason. Answers are cached per
(encoding, shape) key: the trial costs about a second once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from posenc_jax.encodings.base import Encoding
from posenc_jax.encodings.capabilities import ElementwiseBias, KernelRotary
from posenc_jax.model.kernels.flash import check_supported, flash_attention

__all__ = ["PLATFORMS", "unsupported_reason"]

PLATFORMS = ("cuda", "tpu", "cpu")
_TRIAL_LENGTH = 256


def unsupported_reason(encoding: Encoding, *, platform: str, head_dim: int, num_heads: int,
                       num_kv_heads: int | None = None, causal: bool = True,
                       window: int | None = None, segments: bool = False,
                       chunk_size: int | None = None, sinks: bool = False,
                       sink_tokens: int = 0, dtype="bfloat16") -> str | None:
    """None when the kernel lowers for this case on `platform`, else a sentence saying why.

    Args:
      encoding: the layer's encoding (its kernel rotation, if any, is applied in-kernel).
      platform: "cuda", "tpu" or "cpu" (interpret mode: every shape the others take).
      head_dim, num_heads, num_kv_heads: D, H, K (K None -> H).
      causal, window, segments, chunk_size, sink_tokens: the attention's mask (window: keys
        with q - k < window; chunks: kp // c == qp // c; sink tokens exempt from both).
      sinks: whether learned sink logits join the softmax.
      dtype: the activations' dtype.
    """
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {', '.join(map(repr, PLATFORMS))}, got "
                         f"platform={platform!r}")
    kv = num_heads if num_kv_heads is None else num_kv_heads
    try:
        check_supported(encoding)
    except ValueError as e:
        return str(e)
    if head_dim < 1 or num_heads < 1 or kv < 1 or num_heads % kv:
        return (f"head_dim={head_dim}, num_heads={num_heads}, num_kv_heads={kv}: the heads "
                "must be positive and num_kv_heads must divide num_heads")
    enc_heads = getattr(encoding, "num_heads", None)
    if isinstance(encoding, ElementwiseBias) and enc_heads not in (None, num_heads):
        return (f"encoding {encoding.name!r} has num_heads={enc_heads} but the attention has "
                f"num_heads={num_heads}")
    if platform == "cpu":
        return None
    key = (encoding, platform, head_dim, num_heads, kv, bool(causal), window, bool(segments),
           chunk_size, bool(sinks), int(sink_tokens), jnp.dtype(dtype).name)
    try:
        hash(key)
    except TypeError:  # an encoding holding unhashable hyperparameters: not cached
        return _trial.__wrapped__(*key)
    return _trial(*key)


@functools.lru_cache(maxsize=512)
def _trial(encoding, platform, head_dim, num_heads, kv, causal, window, segments, chunk_size,
           sinks, sink_tokens, dtype):
    length = _TRIAL_LENGTH
    params = jax.eval_shape(encoding.init, jax.random.key(0))
    q = jax.ShapeDtypeStruct((1, length, num_heads, head_dim), dtype)
    k = jax.ShapeDtypeStruct((1, length, kv, head_dim), dtype)
    pos = jax.ShapeDtypeStruct((1, length), jnp.int32)
    sink = jax.ShapeDtypeStruct((num_heads,), jnp.float32) if sinks else None
    extra = {"window": window, "chunk_size": chunk_size, "sink_tokens": sink_tokens}

    def f(q, k, v, params, pos, sink):
        seg = jnp.zeros_like(pos) if segments else None
        rotation = (encoding.kernel_rotation(params) if isinstance(encoding, KernelRotary)
                    else None)

        def attn(q, k, v, params, sink):
            return flash_attention(q, k, v, encoding=encoding, params=params, q_positions=pos,
                                   k_positions=pos, causal=causal, q_segment_ids=seg,
                                   k_segment_ids=seg, rotation=rotation, sinks=sink, **extra)

        out, vjp = jax.vjp(attn, q, k, v, params, sink)
        return vjp(out)

    try:
        jax.jit(f).trace(q, k, k, params, pos, sink).lower(lowering_platforms=(platform,))
    except Exception as e:  # noqa: BLE001 -- any lowering failure is the answer
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return (f"the Pallas kernel does not lower for {platform} with encoding "
                f"{encoding.name!r} at head_dim={head_dim}, num_heads={num_heads}, "
                f"num_kv_heads={kv}, causal={causal}, window={window}, chunk_size="
                f"{chunk_size}, sinks={sinks}: "
                f"{type(e).__name__}: {first[:300]}")
    return None
