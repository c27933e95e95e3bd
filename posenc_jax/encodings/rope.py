"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer").

Each pair of features (x_a, x_b) of a query or key at position m is rotated by the angle
m * theta_i, theta_i = base^(-2i / rotary_dim), so that <rot(q, m), rot(k, n)> depends only
on m - n. Two pairings are in use:

* layout="half" (GPT-NeoX, Llama, Hugging Face `rotate_half`): pairs (i, i + R);
* layout="interleaved" (GPT-J, RoFormer, Mesh-TF): pairs (2i, 2i + 1).

Partial rotary (GPT-NeoX `rotary_pct`, HF `partial_rotary_factor`): when 2R < D only the
FIRST 2R features are rotated; the last D - 2R pass through untouched.

Angles are computed in float32 (positions * inv_freq) whatever the activation dtype, the
rotation is done in float32 and cast back to x.dtype. Positions may be int or float (float
positions are meaningful here, e.g. position interpolation).

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

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from posenc_jax._frozen import freeze, thaw
from posenc_jax.checks import boolean, finite_float, integer, integer_array, one_of, positive_int
from posenc_jax.encodings import frequencies as freqs
from posenc_jax.encodings import rope_scaling
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import KernelRotary, KernelRotation, LengthDependent
from posenc_jax.encodings.frequencies import inv_freq

__all__ = ["LAYOUTS", "RoPE", "RotaryBase", "apply", "apply_cos_sin", "cos_sin", "inv_freq"]

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


@dataclasses.dataclass(frozen=True)
class RotaryBase(Encoding):
    """Rotary position embedding (Su et al. 2021) on the first `rotary_dim` dims of q and k.

    `scaling` is a Hugging Face style `rope_scaling` dict (`{"rope_type": "yarn", ...}`), see
    `posenc_jax.encodings.rope_scaling`; `partial_rotary_factor` sets `rotary_dim = int(head_dim * f)`
    as Hugging Face does. Length-dependent scalings (dynamic NTK, LongRoPE) read the sequence
    length as `max(k_positions) + 1`, exactly as Hugging Face does with its position ids.

    Two maps act on the final frequencies, after any scaling method (see `frequencies`):

    * `p_rope` = p in [0, 1] (Barbero et al. 2024): only the floor(p R) highest frequencies
      rotate, the lowest ones are set to 0 (p = 1: RoPE; p = 0: NoPE). Unlike
      `partial_rotary_factor`, the kept frequencies are those of the full rotary_dim.
      Gemma 4's `proportional` rope type is p-RoPE with p = its partial_rotary_factor.
    * `resonance` (Wang et al. 2024): every wavelength 2 pi / theta_i rounded to an integer;
      with `scaling={"rope_type": "yarn", ...}` this is the paper's Resonance YaRN.

    The shared body of `RoPE` (registered "rope", with the kernel-rotation and
    length-dependent capabilities) and `posenc_jax.encodings.mrope.MRoPE`, which has neither.
    """

    hooks: ClassVar = frozenset({"rotate"})

    head_dim: int
    base: float = 10000.0
    rotary_dim: int | None = None
    partial_rotary_factor: float | None = None
    layout: str = "half"
    scaling: Any = None
    max_position_embeddings: int | None = None
    p_rope: float = 1.0
    resonance: bool = False

    def __post_init__(self):
        integer("head_dim", self.head_dim, minimum=2)
        rotary_dim = self._rotary_dim()
        if integer("rotary_dim", rotary_dim) % 2 or not 2 <= rotary_dim <= self.head_dim:
            raise ValueError(f"rope: rotary_dim must be even and in [2, head_dim={self.head_dim}]"
                             f", got rotary_dim={rotary_dim}")
        object.__setattr__(self, "rotary_dim", rotary_dim)
        one_of("layout", self.layout, LAYOUTS)
        if self.max_position_embeddings is not None:
            positive_int("max_position_embeddings", self.max_position_embeddings)
        inv_freq(rotary_dim, base=self.base)  # validates the base
        object.__setattr__(self, "p_rope", finite_float("p_rope", self.p_rope, minimum=0.0,
                                                        maximum=1.0))
        boolean("resonance", self.resonance)
        if self.scaling is not None:
            raw = thaw(self.scaling) if isinstance(self.scaling, tuple) else self.scaling
            scaling = rope_scaling.validate(
                raw, rotary_dim=rotary_dim, max_position_embeddings=self.max_position_embeddings)
            rope_scaling.check_theta(scaling, base=self.base)
            object.__setattr__(self, "scaling", freeze(scaling))

    def _rotary_dim(self) -> int:
        """rotary_dim, or int(head_dim * partial_rotary_factor) where the factor comes from the
        field or from the scaling dict (Hugging Face keeps it there; it used to be ignored);
        given twice, the two must agree."""
        key = "partial_rotary_factor"
        factor = self.partial_rotary_factor
        scaling = thaw(self.scaling) if isinstance(self.scaling, tuple) else self.scaling
        inner = scaling.get(key) if isinstance(scaling, dict) else None
        if inner is not None and key in rope_scaling.method(rope_scaling.resolve_type(
                scaling)).keys:  # a method's own key (proportional: the rotated fraction of
            inner = None        # the frequencies, the whole head dim still rotating)
        if inner is not None:
            inner = finite_float(f"scaling[{key!r}]", inner, above=0, maximum=1)
            if factor is not None and factor != inner:
                raise ValueError(f"rope: {key}={factor!r} and scaling[{key!r}]={inner!r} "
                                 "disagree; give one")
            factor = inner
        if self.rotary_dim is not None:
            if factor is not None and self.rotary_dim != int(self.head_dim * factor):
                raise ValueError(f"rope: give rotary_dim or {key}, not both (got rotary_dim="
                                 f"{self.rotary_dim} and {key}={factor!r})")
            return self.rotary_dim
        if factor is None:
            return self.head_dim
        return int(self.head_dim * finite_float(key, factor, above=0, maximum=1))

    def _table(self, positions, inv_freq, factor: float):
        """cos, sin float32 [..., L, R] of `positions` at `inv_freq` (times `factor`)."""
        return cos_sin(positions, inv_freq, attention_factor=factor)

    @functools.cached_property
    def scaling_dict(self) -> dict[str, Any] | None:
        """The validated scaling dict (None for plain RoPE); validated once, at construction."""
        return None if self.scaling is None else rope_scaling.Validated(thaw(self.scaling))

    @property
    def is_length_dependent(self) -> bool:
        """True when the scaling method reads the sequence length (dynamic NTK, LongRoPE)."""
        return self.scaling is not None and rope_scaling.is_length_dependent(self.scaling_dict)

    def frequencies(self, seq_len: Array | int | None = None) -> tuple[Array, Array]:
        """`(inv_freq [R] float32, attention_factor)` for a sequence of length `seq_len`:
        the scaling method's, then Resonance rounding, then p-RoPE truncation."""
        inv, factor = rope_scaling.frequencies(
            self.scaling_dict, rotary_dim=self.rotary_dim, base=self.base, seq_len=seq_len)
        if self.resonance:
            inv = freqs.resonance(inv)
        if self.p_rope < 1.0:
            inv = freqs.truncate(inv, fraction=self.p_rope)
        return inv, factor

    def _tables(self, params, k_positions, seq_len):
        """positions -> (cos, sin) float32 [..., L, R]: the rotation of this call."""
        del params
        if not self.is_length_dependent:
            seq_len = None
        elif seq_len is None:
            seq_len = jnp.max(k_positions) + 1
        inv_freq, factor = self.frequencies(seq_len)
        # the factor is a concrete float32, never traced
        return lambda positions: self._table(positions, inv_freq, float(factor))

    def rotate(self, params, q, k, q_positions, k_positions, *, seq_len=None):
        integer_array("q_positions", q_positions)
        integer_array("k_positions", k_positions)
        table = self._tables(params, k_positions, seq_len)
        k_cos, k_sin = table(k_positions)
        if q_positions is k_positions:  # self-attention without a cache: one table for both
            q_cos, q_sin = k_cos, k_sin
        else:
            q_cos, q_sin = table(q_positions)
        q = apply_cos_sin(q, q_cos, q_sin, layout=self.layout)
        k = apply_cos_sin(k, k_cos, k_sin, layout=self.layout)
        return q, k


@register("rope")
@dataclasses.dataclass(frozen=True)
class RoPE(RotaryBase, KernelRotary, LengthDependent):
    """Rotary position embedding (Su et al. 2021): `RotaryBase`'s hyperparameters and rotation,
    plus the rotation a kernel can apply in-kernel and the length-dependent regime.

    `unscaled_start` = n (LongRoPE's n-hat, Ding et al. 2024): positions < n rotate with the
    unscaled frequencies (the scaling method's attention factor still applies to all), the
    rest with the scaled ones. 0 (the default) is the scaled rotation alone; no transformers
    config can express n > 0, and no kernel applies it (`kernel_rotation` refuses: use a
    backend that calls `rotate`). Without a scaling dict it changes nothing.

    `frequency_table=True` moves the rotation from this static config into the params: `init`
    returns `frequency_params(max_position_embeddings)` (inv_freq [R], attention_factor [],
    unscaled_start [], float32) and `rotate` reads them, so new frequencies, attention factor
    or start count need new params, not a new program (LongRoPE's search runs every candidate
    through one compiled loss: `train.longrope.fitness`). The params are the rotation at any
    length (not length-dependent) and in the model they are `nnx.Param`s like any encoding's
    (a trainer would train them; keep param_dtype float32: bfloat16 frequencies are coarse).
    No kernel applies it (`kernel_rotation` refuses).
    """

    unscaled_start: int = 0
    frequency_table: bool = False

    def __post_init__(self):
        super().__post_init__()
        integer("unscaled_start", self.unscaled_start, minimum=0)
        boolean("frequency_table", self.frequency_table)

    def init(self, key):
        """`{}`; with `frequency_table`, `frequency_params` at max_position_embeddings."""
        del key
        return self.frequency_params(self.max_position_embeddings) if self.frequency_table else {}

    def frequency_params(self, seq_len: int | None = None) -> dict[str, Array]:
        """The rotation at length `seq_len` (None: within the original context) as the params
        a `frequency_table` encoding rotates with: inv_freq float32 [R], attention_factor
        float32 [] and unscaled_start float32 [] (0 without a scaling dict). Give them to
        `rotate` as params and it rotates exactly as this static encoding does at that length."""
        inv, factor = self.frequencies(seq_len)
        start = self.unscaled_start if self.scaling is not None else 0
        return {"inv_freq": jnp.asarray(inv, jnp.float32),
                "attention_factor": jnp.asarray(factor, jnp.float32),
                "unscaled_start": jnp.asarray(start, jnp.float32)}

    @property
    def is_length_dependent(self) -> bool:
        """As `RotaryBase`'s; never with `frequency_table` (the params are the rotation)."""
        return not self.frequency_table and super().is_length_dependent

    def _tables(self, params, k_positions, seq_len):
        """`RotaryBase._tables`; with `frequency_table`, from the params (traced)."""
        if not self.frequency_table:
            return super()._tables(params, k_positions, seq_len)
        inv_freq = params["inv_freq"].astype(jnp.float32)
        factor = params["attention_factor"].astype(jnp.float32)
        start = params["unscaled_start"].astype(jnp.float32)
        return lambda positions: self._start_table(positions, inv_freq, factor, start)

    def _table(self, positions, inv_freq, factor: float):
        """`RotaryBase._table`, with the rows of positions < unscaled_start at the unscaled
        frequencies (the same attention factor)."""
        if self.unscaled_start == 0 or self.scaling is None:
            return super()._table(positions, inv_freq, factor)
        return self._start_table(positions, inv_freq, factor, self.unscaled_start)

    def _start_table(self, positions, inv_freq, factor, start):
        """cos, sin [..., L, R] at `inv_freq`, and at the unscaled frequencies for positions
        < `start` (an int, or a traced float32 scalar); both times `factor`."""
        cos, sin = cos_sin(positions, inv_freq, attention_factor=factor)
        plain, _ = dataclasses.replace(self, scaling=None, unscaled_start=0,
                                       frequency_table=False).frequencies()
        cos0, sin0 = cos_sin(positions, plain, attention_factor=factor)
        kept = (jnp.asarray(positions).astype(jnp.float32) < start)[..., None]  # [..., L, 1]
        return jnp.where(kept, cos0, cos), jnp.where(kept, sin0, sin)

    def regime(self, k_positions):
        if not self.is_length_dependent:
            return jnp.zeros((), jnp.int32)
        return rope_scaling.regime(self.scaling_dict, seq_len=jnp.max(k_positions) + 1,
                                   max_position_embeddings=self.max_position_embeddings)

    def kernel_rotation(self, params, *, seq_len=None):
        """inv_freq [R], attention factor and layout, for a kernel that rotates in-kernel."""
        if self.frequency_table:
            raise ValueError("rope: frequency_table=True (the rotation read from params, its "
                             "unscaled start a runtime value) cannot be applied in-kernel; use "
                             "an attention backend that calls rotate ('dense' or 'blockwise')")
        if self.unscaled_start and self.scaling is not None:
            raise ValueError(f"rope: unscaled_start={self.unscaled_start} (positions with their "
                             "own frequencies) cannot be applied in-kernel; use an attention "
                             "backend that calls rotate ('dense' or 'blockwise')")
        inv_freq, factor = self.frequencies(seq_len if self.is_length_dependent else None)
        return KernelRotation(inv_freq=inv_freq, attention_factor=factor, layout=self.layout)
