"""Sinusoidal absolute positional encoding (Vaswani et al. 2017, "Attention is all you need").

    PE[..., 2i]   = sin(pos / base^(2i / dim))
    PE[..., 2i+1] = cos(pos / base^(2i / dim))

The sine/cosine pairs are interleaved, as in the paper and the seed table of issue 2. Angles
are always computed in float32; the encoding is float32 (cast it to the activation dtype
when adding it). Because each pair (sin a, cos a) rotates rigidly when pos shifts by k,
PE(pos + k) = PE(pos) @ M_k for a fixed block-diagonal rotation M_k (`shift_matrix`).

Shapes: L length, E = dim the embedding width; positions are [..., L].
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from posenc_jax.checks import finite_float, integer, integer_array, last_axis
from posenc_jax.encodings import rope
from posenc_jax.encodings.base import Encoding, register

__all__ = ["encode", "frequencies", "shift_matrix"]


def _check(dim: int, base: float) -> None:
    if integer("dim", dim) < 2 or dim % 2:
        raise ValueError(f"dim must be an even int >= 2, got dim={dim!r}")
    finite_float("base", base, above=0)


def frequencies(dim: int, *, base: float = 10000.0) -> jnp.ndarray:
    """Angular frequencies 1 / base^(2i/dim) for i = 0..dim/2-1, float32 [dim // 2]."""
    _check(dim, base)
    return rope.inv_freq(dim, base=base)  # the same 1 / base^(2i/d) as RoPE's


def encode(positions, dim: int, *, base: float = 10000.0) -> jnp.ndarray:
    """Sinusoidal encoding of explicit positions.

    Args:
      positions: int or float array [..., L] (any leading dims; computed in float32).
      dim: embedding width E, even and >= 2.
      base: wavelength base (> 0), 10000 in the paper.

    Returns:
      float32 [..., L, E] with sin at even and cos at odd feature indices.

    Raises:
      ValueError: odd or < 2 `dim`, non-positive `base`.
    """
    freq = frequencies(dim, base=base)                          # [E/2]
    cos, sin = rope.cos_sin(positions, freq)                    # [..., L, E/2] each
    pe = jnp.stack([sin, cos], axis=-1)                          # [..., L, E/2, 2]
    return pe.reshape(*pe.shape[:-2], dim)


def shift_matrix(k, dim: int, *, base: float = 10000.0) -> jnp.ndarray:
    """The fixed linear map M_k with encode(pos + k) = encode(pos) @ M_k, float32 [E, E].

    For each pair (s, c) = (sin a, cos a) with frequency w, shifting by k gives
    (s cos kw + c sin kw, c cos kw - s sin kw), i.e. the row vector [s, c] times the 2x2
    block [[cos kw, -sin kw], [sin kw, cos kw]]. M_k is block diagonal with those blocks and
    does not depend on pos.

    Args:
      k: scalar shift (int or float).
      dim: embedding width E, even and >= 2.
      base: wavelength base (> 0).
    """
    freq = frequencies(dim, base=base)                         # [E/2]
    a = jnp.asarray(k, jnp.float32) * freq
    c, s = jnp.cos(a), jnp.sin(a)
    blocks = jnp.stack([jnp.stack([c, -s], -1), jnp.stack([s, c], -1)], -2)  # [E/2, 2, 2]
    eye = jnp.eye(dim // 2, dtype=jnp.float32)                                # [E/2, E/2]
    m = eye[:, None, :, None] * blocks[:, :, None, :]                         # [E/2,2,E/2,2]
    return m.reshape(dim, dim)


@register("sinusoidal")
@dataclasses.dataclass(frozen=True)
class Sinusoidal(Encoding):
    """Fixed sine/cosine table added to the embeddings (Vaswani et al. 2017)."""

    hooks: ClassVar = frozenset({"embed"})

    embed_dim: int
    base: float = 10000.0

    def __post_init__(self):
        integer("embed_dim", self.embed_dim)
        encode(jnp.zeros((1,), jnp.int32), self.embed_dim, base=self.base)

    def embed(self, params, x, positions):
        integer_array("positions", positions)
        last_axis("x", x, self.embed_dim, f"the {self.name} encoding's embed_dim")
        pe = encode(positions, self.embed_dim, base=self.base)
        return x + jnp.broadcast_to(pe, x.shape).astype(x.dtype)
