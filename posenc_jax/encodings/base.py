"""The three-hook interface every positional encoding implements, and the registry.

An encoding is a frozen dataclass holding only configuration (hashable, so it can be a static
argument under `jax.jit`). Learned tables live in an explicit params pytree made by
`init(key)`; stateless schemes return `{}`. The transformer calls the three hooks and knows
nothing else about positions:

    embed(params, x, positions)             x: [B, L, E], positions: [B, L] or [L] -> [B, L, E]
    rotate(params, q, k, q_pos, k_pos)      q: [B, Lq, H, D], k: [B, Lk, K, D] -> (q, k)
    bias(params, q_pos, k_pos, *, q=None)   -> [B, H, Lq, Lk] (or [H, Lq, Lk] for 1-D
                                               positions), float32, or None

Hooks a scheme does not use are the identity (or return None); NoPE uses none of them.
The `q` handed to `bias` is the query already multiplied by the softmax scale, so a
content-dependent bias (Shaw et al.) returns exactly the additive logit term.

Two optional hooks that attention calls inside its loop (after the KV cache, so cached keys
stay valid), both supported by dense and blockwise attention:

    value_term(params, weights, q_pos, k_pos)     weights [B, H, Lq, Lk] -> [B, H, Lq, D]
        added to the attention output, sum_j w_ij u(i, j): Shaw et al.'s a^V. It must be
        LINEAR in `weights` (blockwise attention feeds it unnormalised block weights and
        rescales the sum as it does for p v).
    block_transform(params, q, k, q_pos, k_pos)   -> (q, k) for the block being scored
        a per-block reparametrisation that leaves every q_i . k_j unchanged whatever block
        it is called on: xPos re-centres its exponential scale on the query block so that
        zeta^(n/gamma) never overflows.

and three capabilities, class-level declarations that attention checks (never a name):

    bias_needs_query   the bias hook reads the scaled query (Shaw et al.)
    needs_full_rows    the bias hook reads whole rows of masked logits (CoPE): dense only;
                       blockwise attention and the kernels raise ValueError naming "dense"
    causal_only        defined for causal attention only (xPos): bidirectional raises

    >>> enc = posenc_jax.get("alibi", num_heads=8)
    >>> params = enc.init(jax.random.key(0))            # {} -- ALiBi has nothing to learn
    >>> b = enc.bias(params, jnp.arange(4), jnp.arange(4))   # [8, 4, 4]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

Params = Mapping[str, jax.Array]
Array = jax.Array

_REGISTRY: dict[str, type[Encoding]] = {}


def register(name: str) -> Callable[[type[Encoding]], type[Encoding]]:
    """Class decorator adding an encoding to the registry under `name`."""

    def wrap(cls: type[Encoding]) -> type[Encoding]:
        if name in _REGISTRY:
            raise ValueError(f"encoding name {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def names() -> list[str]:
    """The registered encoding names, sorted."""
    return sorted(_REGISTRY)


def _lookup(name: str) -> type[Encoding]:
    if not isinstance(name, str):
        raise TypeError(f"an encoding name must be a str, got {name!r} ({type(name).__name__})"
                        f"; valid names are: {', '.join(names())}")
    if name not in _REGISTRY:
        raise ValueError(f"Unknown encoding {name!r}; valid names are: {', '.join(names())}")
    return _REGISTRY[name]


def check_model_dim(name: str, key: str, mine: int, model: int) -> None:
    """ValueError unless an encoding built for `key=mine` fits the model's `key=model`."""
    if mine != model:
        raise ValueError(f"encoding {name!r} was built for {key}={mine} but the model has "
                         f"{key}={model}")


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def get(name: str, **hyperparams: Any) -> Encoding:
    """Builds the encoding registered as `name` with the given hyperparameters.

    Raises:
      ValueError: for an unknown name (the message lists the valid ones) or a hyperparameter
        the scheme does not take (the message lists the ones it does take).
      TypeError: for a name that is not a str, or a required hyperparameter left out (the
        message names the missing ones).
    """
    cls = _lookup(name)
    unknown = sorted(set(hyperparams) - set(_fields(cls)))
    if unknown:
        raise ValueError(
            f"encoding {name!r} got unknown hyperparameter(s) {unknown}; "
            f"it takes: {_fields(cls) or 'none'}")
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in hyperparams
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise TypeError(f"encoding {name!r} needs hyperparameter(s) {missing}; it takes: "
                        f"{_fields(cls)}")
    return cls(**hyperparams)


def for_model(name: str, hyperparams: Mapping[str, Any] | None = None, /, *, embed_dim: int,
              num_heads: int, head_dim: int, **more: Any) -> Encoding:
    """Builds an encoding for a model, filling in the model dimensions the scheme declares.

    `embed_dim`, `num_heads` and `head_dim` are passed only to schemes that have such a field.
    Hyperparameters come from the `hyperparams` mapping and/or keywords; a model dimension
    also given there must agree with the model's (else ValueError naming both values).

        enc = for_model("alibi", {"num_heads": 8}, embed_dim=256, num_heads=8, head_dim=32)
    """
    kwargs = dict(hyperparams or {})
    for key in more:
        if key in kwargs:
            raise ValueError(f"encoding {name!r}: hyperparameter {key!r} given twice")
    kwargs.update(more)
    cls = _lookup(name)
    for key, value in cls.model_defaults.items():
        kwargs.setdefault(key, value)
    dims = {"embed_dim": embed_dim, "num_heads": num_heads, "head_dim": head_dim}
    for key, value in dims.items():
        if key not in _fields(cls):
            if key in kwargs:
                raise ValueError(f"encoding {name!r} does not take {key}; it takes: "
                                 f"{_fields(cls) or 'none'}")
            continue
        if key in kwargs and kwargs[key] != value:
            raise ValueError(
                f"encoding {name!r}: {key}={kwargs[key]} does not match the model's "
                f"{key}={value}")
        kwargs[key] = value
    return get(name, **kwargs)


@dataclasses.dataclass(frozen=True)
class Encoding:
    """Base class: every hook is the identity. Subclasses override what they use."""

    name: ClassVar[str] = "base"
    #: True for schemes whose bias hook reads the (scaled) query, e.g. Shaw et al.
    bias_needs_query: ClassVar[bool] = False
    #: Logical axis names of each param `init` returns, by param name (e.g. a learned table
    #: `{"table": ("table", "embed")}`); names are the model's `LOGICAL_AXES`, None replicates,
    #: and a param not listed is replicated. The model shards params by this alone.
    param_axes: ClassVar[Mapping[str, tuple[str | None, ...]]] = {}
    #: Hyperparameter defaults that apply when the scheme is built for a model (`for_model`),
    #: e.g. a learned table initialised at the scale of the sqrt(E)-scaled token embeddings.
    model_defaults: ClassVar[Mapping[str, Any]] = {}
    #: Axes of the positions the rotate hook takes: 1 = [L] or [B, L]; A > 1 = [A, B, L]
    #: (multimodal RoPE: temporal, height, width). The model validates positions by it and
    #: builds its masks from the token order when positions have A > 1 axes.
    position_axes: ClassVar[int] = 1
    #: True for schemes whose bias hook reads whole rows of the masked attention logits
    #: (CoPE): it is called as `bias(params, q_pos, k_pos, q=q_scaled, logits=s)`, s float32
    #: [B, H, Lq, Lk] = q.k * scale with masked entries at -1e30 (keys in position order).
    #: Only dense attention has whole rows; blockwise attention and kernels raise ValueError.
    needs_full_rows: ClassVar[bool] = False
    #: True for schemes defined for causal attention only (xPos); attention raises ValueError
    #: for causal=False.
    causal_only: ClassVar[bool] = False

    @property
    def has_embed(self) -> bool:
        return type(self).embed is not Encoding.embed

    @property
    def has_rotate(self) -> bool:
        return type(self).rotate is not Encoding.rotate

    @property
    def has_bias(self) -> bool:
        return type(self).bias is not Encoding.bias

    @property
    def has_elementwise_bias(self) -> bool:
        """True when the bias is an elementwise function of (q position, k position, head)."""
        return type(self).elementwise_bias is not Encoding.elementwise_bias

    @property
    def has_kernel_rotation(self) -> bool:
        """True when an attention kernel can apply the rotation itself (`kernel_rotation`)."""
        return type(self).kernel_rotation is not Encoding.kernel_rotation

    @property
    def has_value_term(self) -> bool:
        return type(self).value_term is not Encoding.value_term

    @property
    def has_block_transform(self) -> bool:
        return type(self).block_transform is not Encoding.block_transform

    @property
    def max_positions(self) -> int | None:
        """The number of positions the scheme can encode (None: unbounded)."""
        return None

    @property
    def is_length_dependent(self) -> bool:
        """True when the rotation depends on the sequence length (dynamic NTK, LongRoPE)."""
        return False

    def init(self, key: Array) -> Params:
        """Returns the params pytree (`{}` for schemes with nothing to learn)."""
        del key
        return {}

    def embed(self, params: Params, x: Array, positions: Array) -> Array:
        """Adds position information to token embeddings `x: [B, L, E]`."""
        del params, positions
        return x

    def rotate(self, params: Params, q: Array, k: Array, q_positions: Array,
               k_positions: Array, *, seq_len: Array | int | None = None
               ) -> tuple[Array, Array]:
        """Rotates queries `[B, Lq, H, D]` and keys `[B, Lk, K, D]` by their positions.

        `seq_len` is the length a length-dependent scheme reads (dynamic NTK, LongRoPE);
        default `max(k_positions) + 1`. A KV cache passes the whole sequence's length while
        rotating only the new tokens.
        """
        del params, q_positions, k_positions, seq_len
        return q, k

    def bias(self, params: Params, q_positions: Array, k_positions: Array, *,
             q: Array | None = None) -> Array | None:
        """Additive score bias `[B, H, Lq, Lk]` (`[H, Lq, Lk]` for 1-D positions), or None."""
        del params, q_positions, k_positions, q
        return None

    def elementwise_bias(self, params: Params, q_positions: Array, k_positions: Array,
                         head: Array) -> Array | None:
        """The score bias as an elementwise function, or None when it is not one.

        `q_positions` int32 [Bq, 1] and `k_positions` int32 [1, Bk] (any broadcastable shapes),
        `head` an int32 scalar or array broadcastable against them (the query head index).
        Returns float32 of the broadcast shape, computed with elementwise ops and small lookups
        into `params` only, so that a kernel can evaluate it on a block in registers and never
        build [H, Lq, Lk]. A scheme that defines it can implement `bias` with
        `bias_from_elementwise`.
        """
        del params, q_positions, k_positions, head
        return None

    def kernel_rotation(self, params: Params, *, seq_len: Array | int | None = None
                        ) -> KernelRotation | None:
        """What an attention kernel needs to apply `rotate` itself from positions, or None.

        Optional capability of a rotary scheme: the kernel rotates the first `2 R` features of
        q and k at their positions by the angles `position * inv_freq` (cos and sin in
        float32, times `attention_factor`), pairing features as `layout` says ("half":
        (i, i + R); "interleaved": (2i, 2i + 1)); the rest pass through. `seq_len` is the
        length a length-dependent scheme reads (as in `rotate`). Default: None (the kernel
        then receives q and k already rotated by `rotate`).
        """
        del params, seq_len
        return None

    def value_term(self, params: Params, weights: Array, q_positions: Array,
                   k_positions: Array) -> Array | None:
        """A position term added to the attention output: float32 [B, H, Lq, D], or None.

        `weights` float32 [B, H, Lq, Lk] are the attention weights (dense: the softmax
        probabilities; blockwise: a block's unnormalised exp(s - m), masked entries 0);
        positions [B|1, Lq] / [B|1, Lk]. The term must be linear in `weights`, e.g. Shaw et
        al.'s sum_j w_ij a^V_{clip(j - i)}.
        """
        del params, weights, q_positions, k_positions
        return None

    def block_transform(self, params: Params, q: Array, k: Array, q_positions: Array,
                        k_positions: Array) -> tuple[Array, Array]:
        """Transforms the (already rotated, possibly cached) q [B, Lq, H, D] and k [B, Lk, K, D]
        of one attention block; positions [B|1, Lq] / [B|1, Lk]. Attention calls it on every
        (query block, key block) it scores, so q_i . k_j must not depend on the blocking
        (xPos: a scale re-centred on the query block). Default: the identity."""
        del params, q_positions, k_positions
        return q, k

    def regime(self, k_positions: Array) -> Array:
        """An int32 id that changes exactly when the rotation's frequencies change."""
        del k_positions
        return jnp.zeros((), jnp.int32)

    def check_model(self, *, embed_dim: int, num_heads: int, head_dim: int) -> None:
        """Raises ValueError when the scheme cannot serve a model of these dimensions."""
        del embed_dim, num_heads, head_dim


class KernelRotation(NamedTuple):
    """A rotation a kernel applies in-kernel: see `Encoding.kernel_rotation`.

    inv_freq: float32 [R]; attention_factor: float or float32 scalar (multiplies cos and
    sin); layout: "half" or "interleaved".
    """

    inv_freq: Array
    attention_factor: Any
    layout: str


def bias_from_elementwise(encoding: Encoding, params: Params, q_positions: Array,
                          k_positions: Array, *, num_heads: int) -> Array:
    """Evaluates `encoding.elementwise_bias` for every head.

    Args:
      q_positions: int [Lq] or [B, Lq]; k_positions: int [Lk] or [B, Lk].
      num_heads: H.

    Returns:
      float32 [H, Lq, Lk] for 1-D positions, else [B, H, Lq, Lk].
    """
    q = jnp.asarray(q_positions)[..., :, None]
    k = jnp.asarray(k_positions)[..., None, :]
    rank = max(q.ndim, k.ndim)
    q = q.reshape((1,) * (rank - q.ndim) + q.shape)[..., None, :, :]     # [..., 1, Lq, 1]
    k = k.reshape((1,) * (rank - k.ndim) + k.shape)[..., None, :, :]     # [..., 1, 1, Lk]
    head = jnp.arange(num_heads, dtype=jnp.int32).reshape((1,) * (rank - 2) + (num_heads, 1, 1))
    out = encoding.elementwise_bias(params, q, k, head)
    shape = jnp.broadcast_shapes(q.shape, k.shape, head.shape)
    return jnp.broadcast_to(out, shape).astype(jnp.float32)
