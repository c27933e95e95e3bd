"""The core interface every positional encoding implements (init + three hooks), and the registry.

An encoding is a frozen dataclass holding only configuration (hashable, so it can be a static
argument under `jax.jit`). Learned tables live in an explicit params pytree made by
`init(key)`; stateless schemes return `{}`. The core is four functions, each with one
signature, and the `hooks` a scheme declares it uses:

    init(key)                               -> params pytree ({} for stateless schemes)
    embed(params, x, positions)             x: [B, L, E], positions: [B, L] or [L] -> [B, L, E]
    rotate(params, q, k, q_pos, k_pos, *, seq_len=None)
                                            q: [B, Lq, H, D], k: [B, Lk, K, D] -> (q, k)
    bias(params, q_pos, k_pos, *, q=None)   -> [B, H, Lq, Lk] (or [H, Lq, Lk] for 1-D
                                               positions), float32, or None
    hooks                                   the subset of {"embed", "rotate", "bias"} used

A hook a scheme does not declare is the identity (or returns None); NoPE declares none. The
model reads `hooks` to decide where a scheme's params live (the input, or every layer) and
never creates a table that no hook reads. `hooks` is declared rather than inferred so that it
is known without calling or tracing anything, and a test holds every registered scheme's
undeclared hooks to the identity. The `q` handed to `bias` is the query already multiplied
by the softmax scale (read only by `QueryBias` schemes); `seq_len` is read only by
`LengthDependent` ones.

Everything only some schemes need is an optional capability, one small mixin each in
`posenc_jax.encodings.capabilities`, checked with `isinstance`: `ElementwiseBias` (a bias the
kernels evaluate per element), `KernelRotary` (a rotation a kernel applies), `LengthDependent`
(dynamic NTK, LongRoPE), `ValueTerm` (Shaw's a^V), `BlockTransform` and `CausalOnly` (xPos),
`QueryBias` (Shaw), `RowBias` (CoPE: whole rows of logits), `MultiAxisPositions` (M-RoPE),
`MaxPositions` and `ModelDefaults` (learned), `ParamAxes` (params' logical axes).

    >>> enc = posenc_jax.get("alibi", num_heads=8)
    >>> params = enc.init(jax.random.key(0))            # {} -- ALiBi has nothing to learn
    >>> b = enc.bias(params, jnp.arange(4), jnp.arange(4))   # [8, 4, 4]
    >>> isinstance(enc, capabilities.ElementwiseBias)    # True: the kernel can run it
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax

from posenc_jax.encodings import capabilities
from posenc_jax.encodings.capabilities import (
    KernelRotation,
    bias_from_elementwise,
)

__all__ = ["HOOKS", "Encoding", "KernelRotation", "bias_from_elementwise", "for_model", "get",
           "names", "register"]

HOOKS = ("embed", "rotate", "bias")
Params = Mapping[str, jax.Array]
Array = jax.Array

_REGISTRY: dict[str, type[Encoding]] = {}


def register(name: str) -> Callable[[type[Encoding]], type[Encoding]]:
    """Class decorator adding an encoding to the registry under `name`."""

    def wrap(cls: type[Encoding]) -> type[Encoding]:
        if name in _REGISTRY:
            raise ValueError(f"encoding name {name!r} is already registered")
        hooks = cls.hooks
        if not isinstance(hooks, frozenset) or not hooks <= set(HOOKS):
            raise ValueError(f"encoding {name!r} declares hooks={hooks!r}; hooks must be a "
                             f"frozenset of {', '.join(map(repr, HOOKS))}")
        capabilities.check_declared(cls, hooks)
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
    if issubclass(cls, capabilities.ModelDefaults):
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
    """The core: `init` and the three hooks, each the identity here. A scheme overrides the
    hooks it declares in `hooks` and inherits any capabilities it has beside this class."""

    name: ClassVar[str] = "base"
    #: The core hooks the scheme uses, a subset of `HOOKS`; the others stay the identity.
    hooks: ClassVar[frozenset[str]] = frozenset()

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

        `seq_len` is the length a `LengthDependent` scheme reads (dynamic NTK, LongRoPE);
        default `max(k_positions) + 1`. A KV cache passes the whole sequence's length while
        rotating only the new tokens. Other schemes ignore it.
        """
        del params, q_positions, k_positions, seq_len
        return q, k

    def bias(self, params: Params, q_positions: Array, k_positions: Array, *,
             q: Array | None = None) -> Array | None:
        """Additive score bias `[B, H, Lq, Lk]` (`[H, Lq, Lk]` for 1-D positions), or None.

        `q` [B, Lq, H, D] is the query times the softmax scale, read by `QueryBias` schemes."""
        del params, q_positions, k_positions, q
        return None
