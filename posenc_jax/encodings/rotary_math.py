"""RoPE's pure rotation maths: the angles' cos and sin, and the rotation of q or k by them
(`posenc_jax.encodings.rope` builds the encoding on these; it re-exports them).

    cos_sin(positions, inv_freq, attention_factor=)   float32 [..., L, R] each
    apply_cos_sin(x, cos, sin, layout=)               x [..., L, H, D] rotated, x.dtype
    apply(x, positions, inv_freq, layout=)            the two in one

Performance (benchmarks/rope.py; RoPE is memory-bound, so the yardstick is a copy): every
layout, full or partial, is ONE elementwise pass

    rot(x) = x * C + x[..., partner] * S,

with per-position coefficient rows C = [cos, cos], S = [-sin, sin] (placed by layout, 1 and 0
on pass-through features) and a static permutation `partner` of the D features. XLA:CPU
fuses the constant gather into the loop and keeps the inner D axis contiguous, so the loop
vectorises; on [4, 2048, 16, 128] float32 it runs at about the copy's bandwidth, where the
textbook split-halves-then-concatenate form and a port of Hugging Face's `rotate_half`
reach about a quarter (a concatenate on the minor axis turns the fused loop into per-element
branches). Viewing x as [..., 2, R] and flipping the pair axis is the runner-up. bfloat16
is widened and rounded with integer bit operations (bit-identical to `astype`), because
XLA:CPU's own bfloat16 converts are scalar and block vectorisation of the whole fusion.

Shapes: B batch, L length, H heads, D head dim, R = len(inv_freq) rotary frequencies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from posenc_jax.checks import one_of

__all__ = ["LAYOUTS", "apply", "apply_cos_sin", "cos_sin"]

LAYOUTS = ("half", "interleaved")
Array = jax.Array


def cos_sin(positions, inv_freq, *, attention_factor: float = 1.0):
    """cos and sin of the rotation angles, each float32 [..., L, R].

    Args:
      positions: int or float [..., L].
      inv_freq: float [R] (from `inv_freq` or a `rope_scaling` transform).
      attention_factor: multiplies cos and sin (YaRN's mscale); 1.0 for plain RoPE.
    """
    inv_freq = jnp.asarray(inv_freq, jnp.float32)
    if inv_freq.ndim != 1:
        raise ValueError(f"inv_freq must be 1-D [R], got shape {inv_freq.shape}")
    pos = jnp.asarray(positions).astype(jnp.float32)[..., None]             # [..., L, 1]
    angles = pos * inv_freq.reshape((1,) * (pos.ndim - 1) + inv_freq.shape)  # [..., L, R]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if not (isinstance(attention_factor, (int, float)) and attention_factor == 1.0):
        factor = jnp.asarray(attention_factor, jnp.float32)  # may be traced
        cos, sin = cos * factor, sin * factor
    return cos, sin


def _expand(t: jax.Array, x_ndim: int) -> jax.Array:
    """[..., L, D] -> [1.., ..., L, 1, D], the rank of x [..., L, H, D] (rank promotion off)."""
    t = t[..., None, :]
    return t.reshape((1,) * (x_ndim - t.ndim) + t.shape)


def _partner(d: int, r: int, layout: str) -> np.ndarray:
    """Static permutation p of range(D): feature i is rotated together with feature p[i]."""
    p = np.arange(d)
    i = p[: 2 * r]
    p[: 2 * r] = (i + r) % (2 * r) if layout == "half" else i ^ 1
    return p


def _coefficients(cos, sin, d: int, layout: str):
    """Per-feature multipliers C, S [..., L, D] with rot(x) = x * C + x[..., partner] * S."""
    r = cos.shape[-1]
    if layout == "half":
        c, s = jnp.concatenate([cos, cos], -1), jnp.concatenate([-sin, sin], -1)
    else:
        c = jnp.stack([cos, cos], -1).reshape(*cos.shape[:-1], 2 * r)
        s = jnp.stack([-sin, sin], -1).reshape(*sin.shape[:-1], 2 * r)
    if 2 * r < d:  # pass-through features (masked again in apply_cos_sin)
        c = jnp.concatenate([c, jnp.ones(c.shape[:-1] + (d - 2 * r,), c.dtype)], -1)
        s = jnp.concatenate([s, jnp.zeros(s.shape[:-1] + (d - 2 * r,), s.dtype)], -1)
    return c, s


@jax.custom_jvp
def _to_float32(x: jax.Array) -> jax.Array:
    """x.astype(float32), exact; bfloat16 is widened with integer ops (see `_to_x_dtype`).

    Differentiable like `astype` (custom JVP): bit operations alone have no gradient.
    """
    if x.dtype != jnp.bfloat16:
        return x.astype(jnp.float32)
    bits = lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32) << 16
    return lax.bitcast_convert_type(bits, jnp.float32)


@_to_float32.defjvp
def _to_float32_jvp(primals, tangents):
    return _to_float32(primals[0]), tangents[0].astype(jnp.float32)


@jax.custom_jvp
def _round_to_bfloat16(y: jax.Array) -> jax.Array:
    """float32 -> bfloat16 with round-to-nearest-even, bit-identical to y.astype(bfloat16)."""
    u = lax.bitcast_convert_type(y, jnp.uint32)
    rounded = (u + (jnp.uint32(0x7FFF) + ((u >> 16) & jnp.uint32(1)))) >> 16
    rounded = jnp.where(jnp.isnan(y), (u >> 16) | jnp.uint32(0x0040), rounded)  # quiet NaN
    return lax.bitcast_convert_type(rounded.astype(jnp.uint16), jnp.bfloat16)


@_round_to_bfloat16.defjvp
def _round_to_bfloat16_jvp(primals, tangents):
    return _round_to_bfloat16(primals[0]), tangents[0].astype(jnp.bfloat16)


def _to_x_dtype(y: jax.Array, dtype) -> jax.Array:
    """Cast the float32 result back to x's dtype.

    For bfloat16 both directions are written as integer bit operations. They give the same
    bits as `astype`, but XLA:CPU has no native bfloat16: its own converts are scalar code,
    and a `convert` before the partner gather is moved behind it by XLA, which stops the
    whole fusion from vectorising. With bit operations the bfloat16 benchmark runs ~2x faster.
    """
    return _round_to_bfloat16(y) if dtype == jnp.bfloat16 else y.astype(dtype)


def apply_cos_sin(x, cos, sin, *, layout: str = "half") -> jax.Array:
    """Rotate x with precomputed cos/sin.

    Args:
      x: [..., L, H, D] any float dtype.
      cos, sin: float32 [..., L, R] with 2R <= D; their leading dims broadcast against x's
        (e.g. [L, R] or [B, L, R] for x [B, L, H, D]); broadcast over H.
      layout: "half" or "interleaved" (module docstring).

    Returns:
      [..., L, H, D] in x.dtype; the first 2R features rotated, the rest unchanged.

    Raises:
      ValueError: unknown layout, 2R > D, or shapes that do not broadcast.
    """
    one_of("layout", layout, LAYOUTS)
    x = jnp.asarray(x)
    cos, sin = jnp.asarray(cos), jnp.asarray(sin)
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {cos.shape} and {sin.shape}")
    if x.ndim < 3:
        raise ValueError(f"x must be [..., L, H, D], got shape {x.shape}")
    d, r = x.shape[-1], cos.shape[-1]
    if 2 * r > d:
        raise ValueError(f"rotary dim 2R={2 * r} (R={r} frequencies) must be <= head dim D={d}")
    lead_x, lead_c = x.shape[:-2], cos.shape[:-1]
    if len(lead_c) > len(lead_x) or not _broadcasts(lead_c, lead_x):
        raise ValueError(
            f"positions/cos/sin leading shape {lead_c} does not broadcast to x's {lead_x} "
            f"(x is {x.shape} = [..., L, H, D])"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be floating point, got dtype={x.dtype}")
    c, s = _coefficients(cos.astype(jnp.float32), sin.astype(jnp.float32), d, layout)
    c, s = _expand(c, x.ndim), _expand(s, x.ndim)              # [.., L, 1, D]
    # One elementwise pass: rot(x) = x * C + x[..., partner] * S. The static partner gather
    # stays inside the loop fusion and keeps D contiguous, so XLA vectorises it (splitting
    # halves and concatenating them does not; see benchmarks/rope.py).
    xf = _to_float32(x)
    partner = _to_float32(x[..., _partner(d, r, layout)])     # gather in x.dtype (fewer bytes)
    y = xf * c + partner * s
    if 2 * r < d:  # keep pass-through features bit-exact, even inf/NaN
        keep = (jnp.arange(d) >= 2 * r).reshape((1,) * (x.ndim - 1) + (d,))
        y = jnp.where(keep, xf, y)
    return _to_x_dtype(y, x.dtype)


def _broadcasts(a: tuple, b: tuple) -> bool:
    """Whether shape a (right-aligned) broadcasts to shape b."""
    return all(i == j or i == 1 for i, j in zip(a[::-1], b[::-1]))


def apply(x, positions, inv_freq, *, layout: str = "half",
          attention_factor: float = 1.0) -> jax.Array:
    """Apply RoPE to x [..., L, H, D] at positions [..., L] (e.g. [L] or [B, L] for
    x [B, L, H, D]); returns [..., L, H, D] in x.dtype. See `apply_cos_sin` for errors."""
    cos, sin = cos_sin(positions, inv_freq, attention_factor=attention_factor)
    return apply_cos_sin(x, cos, sin, layout=layout)
