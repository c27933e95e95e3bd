"""Multimodal RoPE (M-RoPE; Qwen2-VL, Wang et al. 2024; Qwen2.5-VL; Qwen3-VL's interleaved form).

Each token has three positions, temporal, height and width ([3, B, L]; a text token has the
same value on all three). The R rotary frequencies are split between the three axes by
`mrope_section` = (s_t, s_h, s_w), s_t + s_h + s_w = R:

* chunked (Qwen2-VL, Qwen2.5-VL): frequencies [0, s_t) read the temporal position,
  [s_t, s_t + s_h) the height, the rest the width;
* interleaved (Qwen3-VL): frequency j reads height if j % 3 == 1 and j < 3 s_h, width if
  j % 3 == 2 and j < 3 s_w, else temporal -- every axis keeps high and low frequencies.

Then the rotation is RoPE's (layout "half" in every Qwen model). Angles are float32 products
position * inv_freq, exactly as transformers computes them. 1-D or 2-D positions are
broadcast to the three axes (a text-only sequence), as transformers does; with
text-only positions M-RoPE is plain RoPE.

Shapes: B batch, L length, H heads, D head dim, R rotary frequencies.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import boolean, integer_array
from posenc_jax.encodings.base import register
from posenc_jax.encodings.capabilities import MultiAxisPositions
from posenc_jax.encodings.rope import RotaryBase, apply_cos_sin

__all__ = ["MRoPE", "axis_of_frequency", "cos_sin", "positions_3d"]

Array = jax.Array
AXES = 3


def axis_of_frequency(mrope_section, *, interleaved: bool = False) -> np.ndarray:
    """The position axis (0 temporal, 1 height, 2 width) each frequency reads: int32 [R]."""
    s_t, s_h, s_w = (int(s) for s in mrope_section)
    r = s_t + s_h + s_w
    if not interleaved:
        return np.repeat(np.arange(AXES, dtype=np.int32), [s_t, s_h, s_w])
    axis = np.zeros(r, np.int32)
    j = np.arange(r)
    axis[(j % 3 == 1) & (j < 3 * s_h)] = 1
    axis[(j % 3 == 2) & (j < 3 * s_w)] = 2
    return axis


def positions_3d(positions, what: str = "positions") -> Array:
    """[3, B, L] as given, or [L] / [B, L] broadcast to [3, ...]; ValueError for other
    leading sizes (e.g. [2, B, L])."""
    positions = jnp.asarray(positions)
    if positions.ndim == 3:
        if positions.shape[0] != AXES:
            raise ValueError(f"{what} for multimodal RoPE must be [3, B, L] (temporal, height, "
                             f"width) or [B, L], got shape {positions.shape}")
        return positions
    if positions.ndim not in (1, 2):
        raise ValueError(f"{what} must be [L], [B, L] or [3, B, L], got shape {positions.shape}")
    return jnp.broadcast_to(positions[None], (AXES, *positions.shape))


def cos_sin(positions, inv_freq, axis: np.ndarray, *, attention_factor: float = 1.0):
    """cos and sin float32 [..., L, R] for positions [3, ..., L]: frequency i rotates by
    positions[axis[i]] * inv_freq[i]."""
    inv_freq = jnp.asarray(inv_freq, jnp.float32)
    pos = jnp.moveaxis(jnp.asarray(positions), 0, -1)                 # [..., L, 3]
    pos = jnp.take(pos, jnp.asarray(axis), axis=-1).astype(jnp.float32)  # [..., L, R]
    angles = pos * inv_freq.reshape((1,) * (pos.ndim - 1) + inv_freq.shape)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if not (isinstance(attention_factor, (int, float)) and attention_factor == 1.0):
        factor = jnp.asarray(attention_factor, jnp.float32)
        cos, sin = cos * factor, sin * factor
    return cos, sin


@register("mrope")
@dataclasses.dataclass(frozen=True)
class MRoPE(RotaryBase, MultiAxisPositions):
    """Multimodal RoPE: RoPE's hyperparameters plus `mrope_section` (s_t, s_h, s_w), which must
    sum to rotary_dim // 2 (default None: Qwen2-VL's proportions, R/4 temporal and 3R/8 each
    for height and width), and `interleaved` (Qwen3-VL). The rotate hook takes positions
    [3, B, L] (or [B, L] / [L], broadcast to the three axes). Neither `KernelRotary` (a
    kernel rotates from 1-D positions; the model rotates q and k before the kernel) nor
    `LengthDependent` (refused at construction)."""

    mrope_section: tuple | None = None
    interleaved: bool = False
    position_axes: ClassVar[int] = AXES

    def __post_init__(self):
        super().__post_init__()
        section = self.mrope_section
        if section is None:  # Qwen2-VL's proportions: (16, 24, 24) of R = 64
            hw = 3 * (self.rotary_dim // 2) // 8
            section = (self.rotary_dim // 2 - 2 * hw, hw, hw)
        if isinstance(section, (str, bytes)) or not hasattr(section, "__len__") or len(
                section) != AXES or not all(isinstance(s, (int, np.integer)) and not isinstance(
                    s, bool) and s >= 0 for s in section):
            raise ValueError(f"mrope: mrope_section must be 3 ints >= 0 (temporal, height, "
                             f"width), got mrope_section={section!r}")
        section = tuple(int(s) for s in section)
        if sum(section) != self.rotary_dim // 2:
            raise ValueError(f"mrope: mrope_section={list(section)} sums to {sum(section)} but "
                             f"must sum to rotary_dim / 2 = {self.rotary_dim // 2}")
        boolean("interleaved", self.interleaved)
        if self.is_length_dependent:
            raise ValueError("mrope: length-dependent scaling (dynamic NTK, LongRoPE) is not "
                             f"supported, got rope_type={self.scaling_dict['rope_type']!r}")
        object.__setattr__(self, "mrope_section", section)

    def rotate(self, params, q, k, q_positions, k_positions, *, seq_len=None):
        del seq_len  # no length-dependent scaling here (refused at construction)
        integer_array("q_positions", q_positions)
        integer_array("k_positions", k_positions)
        inv_freq, factor = self.frequencies(None)
        axis = axis_of_frequency(self.mrope_section, interleaved=self.interleaved)

        def table(positions, what):
            return cos_sin(positions_3d(positions, what), inv_freq, axis,
                           attention_factor=float(factor))

        k_cos, k_sin = table(k_positions, "k_positions")
        q_cos, q_sin = (k_cos, k_sin) if q_positions is k_positions else table(
            q_positions, "q_positions")
        return (apply_cos_sin(q, q_cos, q_sin, layout=self.layout),
                apply_cos_sin(k, k_cos, k_sin, layout=self.layout))
