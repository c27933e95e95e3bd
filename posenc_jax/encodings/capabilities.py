"""Optional capabilities of an encoding, each declared once, each checked with `isinstance`.

The core (`posenc_jax.encodings.base.Encoding`) is `init` and the three hooks. What only some
schemes need is a small mixin here, which a scheme inherits beside `Encoding` (as optax gives
extra-args transformations their own type), and which its consumers test with `isinstance`:

    capability           members                          schemes            consumers
    ElementwiseBias      elementwise_bias(p, qp, kp, h)   alibi t5 kerple    the Pallas kernels,
                                                          sandwich fire      bias_from_elementwise
    KernelRotary         kernel_rotation(p, *, seq_len)   rope               the rotation rule,
                                                                             the kernels
    LengthDependent      is_length_dependent, regime(kp)  rope               kv_cache, rotation
    ValueTerm            value_term(p, w, qp, kp)         shaw (value=True)  explicit, blockwise
    BlockTransform       block_transform(p, q, k, qp, kp) xpos               dense, blockwise
    CausalOnly           (a marker)                       xpos               the backends
    QueryBias            (a marker: bias reads q)         shaw               scores, linen
    RowBias              row_bias(p, qp, kp, *, q, logits) cope              scores (explicit)
    MultiAxisPositions   position_axes                    mrope              config, scores
    MaxPositions         max_positions                    learned            transformer,
                                                                             generate, train
    ModelDefaults        model_defaults                   learned            base.for_model
    ParamAxes            param_axes                       learned t5 shaw... transformer

Each capability refines one core hook (`REFINES`): `register` refuses a scheme that has a
capability without declaring the hook it refines (an `ElementwiseBias` without "bias" in
`hooks`), so "which hooks does it use" stays the one question the model asks before creating
params. The abstract members are enforced at construction (TypeError naming the missing one).

Shapes: B batch, Lq / Lk query / key lengths, H heads, D head dim, R rotary frequencies.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "REFINES", "BlockTransform", "CausalOnly", "ElementwiseBias", "KernelRotary", "KernelRotation",
    "LengthDependent", "MaxPositions", "ModelDefaults", "MultiAxisPositions", "ParamAxes",
    "QueryBias", "RowBias", "ValueTerm", "bias_from_elementwise", "check_declared",
    "is_length_dependent", "max_positions", "param_axes", "position_axes",
]

Array = jax.Array
Params = Mapping[str, Array]


class ElementwiseBias(abc.ABC):
    """The score bias as an elementwise function of (query position, key position, head).

    Consumers: the Pallas kernels (`model/kernels/block_math.py` evaluates it on each block in
    registers, never building [H, Lq, Lk]), the attention backends' `supports` (a bias the
    kernel can run), and `bias_from_elementwise` (a scheme's `bias` from it).
    """

    @abc.abstractmethod
    def elementwise_bias(self, params: Params, q_positions: Array, k_positions: Array,
                         head: Array) -> Array:
        """`q_positions` int32 [Bq, 1], `k_positions` int32 [1, Bk] (any broadcastable shapes),
        `head` int32 broadcastable against them (the query head) -> float32 of the broadcast
        shape, with elementwise ops and small lookups into `params` only."""


class KernelRotation(NamedTuple):
    """A rotation a kernel applies in-kernel (see `KernelRotary.kernel_rotation`).

    inv_freq: float32 [R]; attention_factor: float or float32 scalar (multiplies cos and
    sin); layout: "half" or "interleaved".
    """

    inv_freq: Array
    attention_factor: Any
    layout: str


class KernelRotary(abc.ABC):
    """A rotation an attention kernel can apply itself, from positions.

    Consumers: the rotation rule (`posenc_jax.model.rotation`: with a backend that rotates
    inside, q, k and the KV cache stay raw) and the Pallas kernels (cos/sin in float32).
    """

    @abc.abstractmethod
    def kernel_rotation(self, params: Params, *, seq_len: Array | int | None = None
                        ) -> KernelRotation:
        """The kernel rotates the first 2R features of q and k by `position * inv_freq` (times
        `attention_factor`), pairing features as `layout` says; the rest pass through.
        `seq_len` as in `rotate` (read by length-dependent schemes only)."""


class LengthDependent(abc.ABC):
    """A rotation whose frequencies may depend on the sequence length (dynamic NTK, LongRoPE).

    Consumers: `model/kv_cache.py` (the regime of the cached keys; a change rebuilds the
    cache), the rotation rule (which length `rotate` reads), `TransformerConfig` and
    `encodings/hf/rotate.py`. Use `is_length_dependent(enc)` to ask any encoding.
    """

    @property
    @abc.abstractmethod
    def is_length_dependent(self) -> bool:
        """True when this instance's rotation reads the length (e.g. its scaling method)."""

    @abc.abstractmethod
    def regime(self, k_positions: Array) -> Array:
        """An int32 scalar id that changes exactly when the rotation's frequencies change."""


class ValueTerm(abc.ABC):
    """A position term added to the attention output (Shaw et al.'s a^V).

    Consumers: `model/explicit.py` (dense with explicit probabilities) and
    `model/blockwise.py` (fed each block's unnormalised weights); the kernels have none.
    """

    @abc.abstractmethod
    def value_term(self, params: Params, weights: Array, q_positions: Array,
                   k_positions: Array) -> Array:
        """`weights` float32 [B, H, Lq, Lk] (dense: probabilities; blockwise: a block's
        unnormalised exp(s - m)), positions [B|1, Lq] / [B|1, Lk] -> float32 [B, H, Lq, D].
        Must be LINEAR in `weights` (blockwise attention rescales the sum as p v)."""


class BlockTransform(abc.ABC):
    """A per-block reparametrisation of the (rotated, possibly cached) q and k (xPos).

    Consumers: dense attention (the whole query set is one block) and `model/blockwise.py`
    (every scored block); the kernels have none.
    """

    @abc.abstractmethod
    def block_transform(self, params: Params, q: Array, k: Array, q_positions: Array,
                        k_positions: Array) -> tuple[Array, Array]:
        """q [B, Lq, H, D], k [B, Lk, K, D] of one block, positions [B|1, L] -> (q, k), such
        that q_i . k_j does not depend on the blocking."""


class CausalOnly(abc.ABC):
    """A scheme defined for causal attention only (xPos's decay grows the other way).

    Consumers: the attention backends' `supports` (causal=False is refused, naming why).
    """


class QueryBias(abc.ABC):
    """The bias hook reads the query: `bias(params, q_pos, k_pos, q=q * scale)` (Shaw et al.).

    Consumers: `model/scores.py` (passes the scaled query, broadcasts positions to the batch)
    and `model/linen.py` (`ScoreBias` then requires q).
    """


class RowBias(abc.ABC):
    """A bias that reads whole rows of the masked logits (CoPE); its `bias` hook refuses.

    Consumers: `model/scores.py`, called by `model/explicit.py` (only dense attention has
    whole rows); the attention backends' `supports` refuse it everywhere else.
    """

    @abc.abstractmethod
    def row_bias(self, params: Params, q_positions: Array, k_positions: Array, *, q: Array,
                 logits: Array) -> Array:
        """q [B, Lq, H, D] times the softmax scale, logits float32 [B, H, Lq, Lk] = q.k * scale
        with masked entries at -1e30 (keys in position order) -> float32 [B, H, Lq, Lk]."""


class MultiAxisPositions(abc.ABC):
    """Positions with A > 1 axes, [A, B, L] (multimodal RoPE: temporal, height, width).

    Consumers: `TransformerConfig.position_axes` and `model/scores.split_positions` (the
    model then builds its masks from the token order). Ask any encoding `position_axes(enc)`.
    """

    position_axes: ClassVar[int]


class MaxPositions(abc.ABC):
    """A table with a maximum number of positions (learned absolute positions).

    Consumers: the transformer and `generate` (refuse longer inputs), `train/config_check.py`
    and the study's plan. Ask any encoding `max_positions(enc)` (None: unbounded).
    """

    @property
    @abc.abstractmethod
    def max_positions(self) -> int:
        """The number of positions the scheme can encode."""


class ModelDefaults(abc.ABC):
    """Hyperparameter defaults that apply when the scheme is built for a model, e.g. a learned
    table initialised at the scale of the sqrt(E)-scaled token embeddings.

    Consumer: `posenc_jax.encodings.base.for_model` (never `get`).
    """

    model_defaults: ClassVar[Mapping[str, Any]]


class ParamAxes(abc.ABC):
    """Logical axis names of the params `init` returns, by param name (names of the model's
    `LOGICAL_AXES`; None replicates; a param not listed is replicated).

    Consumer: `model/transformer.encoding_params`, which shards params by this alone. Ask any
    encoding `param_axes(enc)` ({} without the capability).
    """

    param_axes: ClassVar[Mapping[str, tuple[str | None, ...]]]


#: The core hook each capability refines; `check_declared` holds a scheme to it.
REFINES: Mapping[type, str] = {
    ElementwiseBias: "bias", QueryBias: "bias", RowBias: "bias", ValueTerm: "bias",
    KernelRotary: "rotate", LengthDependent: "rotate", BlockTransform: "rotate",
    CausalOnly: "rotate", MultiAxisPositions: "rotate", MaxPositions: "embed",
}


_DECLARED = {MultiAxisPositions: "position_axes", ModelDefaults: "model_defaults",
             ParamAxes: "param_axes"}


def check_declared(cls: type, hooks: frozenset) -> None:
    """ValueError unless every capability of `cls` refines a hook it declares; TypeError when
    a declaring capability (`ParamAxes`, ...) leaves its class variable unset."""
    for capability, attr in _DECLARED.items():
        if issubclass(cls, capability) and not hasattr(cls, attr):
            raise TypeError(f"encoding class {cls.__name__} is a {capability.__name__} but does "
                            f"not set {attr}")
    for capability, hook in REFINES.items():
        if issubclass(cls, capability) and hook not in hooks:
            raise ValueError(f"encoding class {cls.__name__} is a {capability.__name__}, which "
                             f"refines the {hook!r} hook, but declares hooks={sorted(hooks)}")


def is_length_dependent(encoding: Any) -> bool:
    """True when the encoding's rotation reads the sequence length (`LengthDependent`)."""
    return isinstance(encoding, LengthDependent) and bool(encoding.is_length_dependent)


def position_axes(encoding: Any) -> int:
    """Axes of the positions the rotate hook takes: 1 ([L] / [B, L]) or A ([A, B, L])."""
    return encoding.position_axes if isinstance(encoding, MultiAxisPositions) else 1


def max_positions(encoding: Any) -> int | None:
    """The number of positions the encoding can encode (None: unbounded)."""
    return encoding.max_positions if isinstance(encoding, MaxPositions) else None


def param_axes(encoding: Any) -> Mapping[str, tuple[str | None, ...]]:
    """The declared logical axes of the encoding's params ({}: all replicated)."""
    return encoding.param_axes if isinstance(encoding, ParamAxes) else {}


def bias_from_elementwise(encoding: ElementwiseBias, params: Params, q_positions: Array,
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
