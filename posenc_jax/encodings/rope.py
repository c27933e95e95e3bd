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

Shapes: B batch, L length, H heads, D head dim, R = len(inv_freq) rotary frequencies.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from posenc_jax._frozen import freeze, thaw
from posenc_jax.checks import boolean, finite_float, integer, integer_array, one_of, positive_int
from posenc_jax.encodings import frequencies as freqs
from posenc_jax.encodings import rope_scaling
from posenc_jax.encodings.base import Encoding, register
from posenc_jax.encodings.capabilities import KernelRotary, KernelRotation, LengthDependent
from posenc_jax.encodings.frequencies import inv_freq
from posenc_jax.encodings.rotary_math import (  # noqa: F401  (re-exported; the tests read the
    LAYOUTS,  # bf16 helpers)
    _round_to_bfloat16,
    _to_float32,
    apply,
    apply_cos_sin,
    cos_sin,
)

__all__ = ["LAYOUTS", "RoPE", "RotaryBase", "apply", "apply_cos_sin", "cos_sin", "inv_freq"]

Array = jax.Array



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
