"""The built-in encodings: NoPE, sinusoidal, learned, RoPE (+ scaling), ALiBi, T5, Shaw.

Each is a frozen dataclass registered under its name in `posenc_jax.encoding`'s registry and
implements only the hooks it needs (`posenc_jax.encoding.Encoding` documents the interface).
Hyperparameters are the dataclass fields; `posenc_jax.get(name, **fields)` builds one, and
`posenc_jax.for_model` fills in the model dimensions a scheme declares.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax.numpy as jnp

from posenc_jax import alibi, learned, relative, rope, rope_scaling, sinusoidal
from posenc_jax._checks import require_integer
from posenc_jax._frozen import freeze, thaw
from posenc_jax.encoding import Array, Encoding, register


def _check_equal(name: str, key: str, mine: int, model: int) -> None:
    if mine != model:
        raise ValueError(f"encoding {name!r} was built for {key}={mine} but the model has "
                         f"{key}={model}")


@register("nope")
@dataclasses.dataclass(frozen=True)
class NoPE(Encoding):
    """No positional encoding: all three hooks do nothing (Kazemnejad et al. 2023)."""


@register("sinusoidal")
@dataclasses.dataclass(frozen=True)
class Sinusoidal(Encoding):
    """Fixed sine/cosine table added to the embeddings (Vaswani et al. 2017)."""

    embed_dim: int
    base: float = 10000.0

    def __post_init__(self):
        sinusoidal.encode(jnp.zeros((1,), jnp.int32), self.embed_dim, base=self.base)

    def embed(self, params, x, positions):
        require_integer(positions, "positions")
        pe = sinusoidal.encode(positions, x.shape[-1], base=self.base)
        return x + jnp.broadcast_to(pe, x.shape).astype(x.dtype)

    def check_model(self, *, embed_dim, num_heads, head_dim):
        _check_equal(self.name, "embed_dim", self.embed_dim, embed_dim)


@register("learned")
@dataclasses.dataclass(frozen=True)
class Learned(Encoding):
    """A learned table of `max_len` absolute positions added to the embeddings.

    A position outside [0, max_len) is an error (concrete positions) or NaN (traced ones),
    never a silent clamp.
    """

    embed_dim: int
    max_len: int = 2048
    stddev: float = 0.02

    def __post_init__(self):
        if not isinstance(self.max_len, int) or self.max_len < 1:
            raise ValueError(f"learned: max_len must be a positive int, got {self.max_len!r}")
        if not isinstance(self.embed_dim, int) or self.embed_dim < 1:
            raise ValueError(f"learned: embed_dim must be a positive int, got {self.embed_dim!r}")

    @property
    def max_positions(self):
        return self.max_len

    def init(self, key):
        return {"table": learned.init(key, self.max_len, self.embed_dim, stddev=self.stddev)}

    def embed(self, params, x, positions):
        pe = learned.lookup(params["table"], positions)
        return x + jnp.broadcast_to(pe, x.shape).astype(x.dtype)

    def check_model(self, *, embed_dim, num_heads, head_dim):
        _check_equal(self.name, "embed_dim", self.embed_dim, embed_dim)


@register("rope")
@dataclasses.dataclass(frozen=True)
class RoPE(Encoding):
    """Rotary position embedding (Su et al. 2021) on the first `rotary_dim` dims of q and k.

    `scaling` is a Hugging Face style `rope_scaling` dict (`{"rope_type": "yarn", ...}`), see
    `posenc_jax.rope_scaling`; `partial_rotary_factor` sets `rotary_dim = int(head_dim * f)`
    as Hugging Face does. Length-dependent scalings (dynamic NTK, LongRoPE) read the sequence
    length as `max(k_positions) + 1`, exactly as Hugging Face does with its position ids.
    """

    head_dim: int
    base: float = 10000.0
    rotary_dim: int | None = None
    partial_rotary_factor: float | None = None
    layout: str = "half"
    scaling: Any = None
    max_position_embeddings: int | None = None

    def __post_init__(self):
        if not isinstance(self.head_dim, int) or self.head_dim < 2:
            raise ValueError(f"rope: head_dim must be an int >= 2, got {self.head_dim!r}")
        rotary_dim = self.rotary_dim
        if rotary_dim is None:
            factor = 1.0 if self.partial_rotary_factor is None else self.partial_rotary_factor
            if not 0.0 < factor <= 1.0:
                raise ValueError(
                    f"rope: partial_rotary_factor must be in (0, 1], got {factor!r}")
            rotary_dim = int(self.head_dim * factor)
        elif self.partial_rotary_factor is not None:
            raise ValueError("rope: give rotary_dim or partial_rotary_factor, not both "
                             f"(got {self.rotary_dim} and {self.partial_rotary_factor})")
        if rotary_dim % 2 or not 2 <= rotary_dim <= self.head_dim:
            raise ValueError(f"rope: rotary_dim must be even and in [2, head_dim={self.head_dim}]"
                             f", got rotary_dim={rotary_dim}")
        object.__setattr__(self, "rotary_dim", rotary_dim)
        if self.layout not in ("half", "interleaved"):
            raise ValueError(f"rope: unknown layout {self.layout!r}; valid: 'half', 'interleaved'")
        rope.inv_freq(rotary_dim, base=self.base)  # validates the base
        if self.scaling is not None:
            raw = thaw(self.scaling) if isinstance(self.scaling, tuple) else self.scaling
            scaling = rope_scaling.validate(
                raw, rotary_dim=rotary_dim, max_position_embeddings=self.max_position_embeddings)
            rope_scaling.check_theta(scaling, base=self.base)
            object.__setattr__(self, "scaling", freeze(scaling))

    @functools.cached_property
    def scaling_dict(self) -> dict[str, Any] | None:
        """The validated scaling dict (None for plain RoPE)."""
        return None if self.scaling is None else thaw(self.scaling)

    @property
    def is_length_dependent(self):
        return self.scaling is not None and rope_scaling.is_length_dependent(self.scaling_dict)

    def frequencies(self, seq_len: Array | int | None = None) -> tuple[Array, Array]:
        """`(inv_freq [R] float32, attention_factor)` for a sequence of length `seq_len`."""
        return rope_scaling.frequencies_validated(
            self.scaling_dict, rotary_dim=self.rotary_dim, base=self.base, seq_len=seq_len)

    def regime(self, k_positions):
        if not self.is_length_dependent:
            return jnp.zeros((), jnp.int32)
        return rope_scaling.regime(self.scaling_dict, seq_len=jnp.max(k_positions) + 1,
                                   max_position_embeddings=self.max_position_embeddings)

    def rotate(self, params, q, k, q_positions, k_positions, *, seq_len=None):
        require_integer(q_positions, "q_positions")
        require_integer(k_positions, "k_positions")
        if not self.is_length_dependent:
            seq_len = None
        elif seq_len is None:
            seq_len = jnp.max(k_positions) + 1
        inv_freq, factor = self.frequencies(seq_len)

        def table(positions):  # the factor is a concrete float32, never traced
            return rope.cos_sin(positions, inv_freq, attention_factor=float(factor))

        k_cos, k_sin = table(k_positions)
        if q_positions is k_positions:  # self-attention without a cache: one table for both
            q_cos, q_sin = k_cos, k_sin
        else:
            q_cos, q_sin = table(q_positions)
        q = rope.apply_cos_sin(q, q_cos, q_sin, layout=self.layout)
        k = rope.apply_cos_sin(k, k_cos, k_sin, layout=self.layout)
        return q, k

    def check_model(self, *, embed_dim, num_heads, head_dim):
        _check_equal(self.name, "head_dim", self.head_dim, head_dim)


@register("alibi")
@dataclasses.dataclass(frozen=True)
class ALiBi(Encoding):
    """Attention with linear biases (Press et al. 2022): `-slope_h * |i - j|` on the scores."""

    num_heads: int

    def __post_init__(self):
        alibi.slopes(self.num_heads)  # validates

    def bias(self, params, q_positions, k_positions, *, q=None):
        return alibi.bias(alibi.slopes(self.num_heads), q_positions, k_positions)

    def check_model(self, *, embed_dim, num_heads, head_dim):
        _check_equal(self.name, "num_heads", self.num_heads, num_heads)


@register("t5")
@dataclasses.dataclass(frozen=True)
class T5Bias(Encoding):
    """T5's learned bias per head over log-spaced relative-position buckets (Raffel et al.)."""

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = False

    def __post_init__(self):
        if not isinstance(self.num_heads, int) or self.num_heads < 1:
            raise ValueError(f"t5: num_heads must be a positive int, got {self.num_heads!r}")
        relative.t5_bucket(jnp.zeros((1,), jnp.int32), bidirectional=self.bidirectional,
                           num_buckets=self.num_buckets, max_distance=self.max_distance)

    def init(self, key):
        return {"table": relative.t5_init(key, num_buckets=self.num_buckets,
                                          num_heads=self.num_heads)}

    def bias(self, params, q_positions, k_positions, *, q=None):
        return relative.t5_bias(params["table"], q_positions, k_positions,
                                bidirectional=self.bidirectional, num_buckets=self.num_buckets,
                                max_distance=self.max_distance)

    def check_model(self, *, embed_dim, num_heads, head_dim):
        _check_equal(self.name, "num_heads", self.num_heads, num_heads)


@register("shaw")
@dataclasses.dataclass(frozen=True)
class Shaw(Encoding):
    """Shaw et al. (2018) relative position embeddings: `2K + 1` learned vectors, the score
    term `q_i . a_{clip(j - i, -K, K)}` with K = `max_relative_position`."""

    bias_needs_query: ClassVar[bool] = True

    head_dim: int
    max_relative_position: int = 16

    def __post_init__(self):
        if not isinstance(self.max_relative_position, int) or self.max_relative_position < 1:
            raise ValueError("shaw: max_relative_position (K) must be an int >= 1, got "
                             f"{self.max_relative_position!r}")
        if not isinstance(self.head_dim, int) or self.head_dim < 1:
            raise ValueError(f"shaw: head_dim must be a positive int, got {self.head_dim!r}")

    def init(self, key):
        return {"table": relative.shaw_init(key, max_relative_position=self.max_relative_position,
                                            head_dim=self.head_dim)}

    def bias(self, params, q_positions, k_positions, *, q=None):
        if q is None:
            raise ValueError("shaw: the bias depends on the query; call bias(..., q=q) with the "
                             "scaled query [B, Lq, H, D]")
        return relative.shaw_bias(params["table"], q, q_positions, k_positions,
                                  max_relative_position=self.max_relative_position)

    def check_model(self, *, embed_dim, num_heads, head_dim):
        _check_equal(self.name, "head_dim", self.head_dim, head_dim)
