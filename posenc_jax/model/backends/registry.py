"""The attention-backend registry: one `Backend` record per compute path, and the chooser.

A record says what the backend supports (the bias kinds it computes, whether it applies a
rotation inside, causal / bidirectional, grouped-query attention, a sliding window, chunked
attention, learned sinks and sink tokens, the platforms it lowers for, value terms, block
transforms) and how it is called (`call(inputs) -> out`, and `call_lse(inputs) -> (out,
lse)` for a backend that can be a context-parallel step). Everything that decides "may this
encoding run here" asks `Backend.supports`, which returns None or the reason; "auto" is
`choose`, which reads the records alone, for `attend` and for context parallelism's steps
alike (`run(..., lse=True)`); `TransformerConfig` asks `check` (with the host's platform,
`host_platform`), the study and `train.xla_flags` read names and properties from here. No
backend name is spelled outside this package.

Shapes: B batch, Lq / Lk query / key lengths, H query heads, K kv heads, D head dim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax

from posenc_jax.encodings import capabilities as cap
from posenc_jax.encodings.base import Encoding

__all__ = ["AUTO", "PLATFORMS", "Backend", "Inputs", "Shapes", "bias_kind", "check", "choose",
           "get", "host_platform", "names", "register", "resolve", "run"]

Array = jax.Array
AUTO = "auto"
#: The platforms a record may lower for (`jax.lax.platform_dependent`'s names).
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
#: The kinds of score bias an encoding can have (`bias_kind`), and what each needs.
BIAS_KINDS = {
    "elementwise": "has a score bias that is an elementwise function of (query position, key "
                   "position, head) (an ElementwiseBias)",
    "positions": "has a score bias computed from the positions of a block",
    "query": "has a score bias that reads the query (a QueryBias)",
    "rows": "reads whole rows of attention logits (a RowBias)",
}
_REGISTRY: dict[str, Backend] = {}


class Shapes(NamedTuple):
    """The sizes a backend may support or not: q [B, Lq, H, D], k/v [B, Lk, K, D]."""

    batch: int
    q_len: int
    k_len: int
    heads: int
    kv_heads: int
    head_dim: int
    window: int | None = None     # a sliding window (None: unlimited)
    chunk_size: int | None = None  # chunked attention (None: no chunks)
    sinks: bool = False           # learned sink logits per head
    sink_tokens: int = 0          # the first positions stay visible beside a window / chunk


class Inputs(NamedTuple):
    """What `attend` hands a backend's `call`: validated, positions etc. [B|1, L].

    q, k are rotated unless `rotation` is given (then raw, for a backend that `rotates_inside`).
    `same_positions`: self-attention with one positions array and no key mask (q_positions
    is k_positions), so a backend may use an index-causal mask.
    """

    q: Array
    k: Array
    v: Array
    encoding: Encoding
    params: Any
    q_positions: Array
    k_positions: Array
    q_segment_ids: Array | None
    k_segment_ids: Array | None
    k_mask: Array | None
    causal: bool
    block_q: int
    block_k: int
    rotation: cap.KernelRotation | None
    same_positions: bool
    kernel_blocks: Any = None      # the Pallas kernel's block sizes (`kernels.blocks`)
    window: int | None = None      # sliding window: key kp visible to qp iff qp - kp < window
    chunk_size: int | None = None  # chunks: visible iff kp // chunk_size == qp // chunk_size
    sink_tokens: int = 0           # keys with kp < sink_tokens escape the window and chunk
    sinks: Array | None = None     # float [H] learned sink logits (None: none)


def bias_kind(encoding: Encoding) -> str | None:
    """None (no bias hook) or one of `BIAS_KINDS`, from the encoding's capabilities."""
    if "bias" not in encoding.hooks:
        return None
    if isinstance(encoding, cap.RowBias):
        return "rows"
    if isinstance(encoding, cap.ElementwiseBias):
        return "elementwise"
    return "query" if isinstance(encoding, cap.QueryBias) else "positions"


@dataclasses.dataclass(frozen=True)
class Backend:
    """One attention backend: what it supports and how it is called.

    Attributes:
      name: the `attention=` / `implementation=` value.
      call: `call(inputs: Inputs) -> [B, Lq, H, D]` in q.dtype.
      bias: the `BIAS_KINDS` it computes (an encoding without a bias runs everywhere).
      platforms: where it lowers ("cpu" includes Pallas interpret mode).
      rotates_inside: applies a `KernelRotary` rotation itself: q, k and a KV cache stay raw.
      value_term, block_transform: applies a `ValueTerm` / `BlockTransform`.
      causal, bidirectional, gqa: masks and shapes it supports (every backend takes segment
        ids and a key mask, so KV-cache decoding).
      sliding_window: a local window mask from positions (`Inputs.window`, `Shapes.window`).
      chunked: chunked attention from positions (`Inputs.chunk_size`).
      sinks: learned sink logits per head in the denominator (`Inputs.sinks`).
      sink_tokens: keys at positions < k exempt from the window / chunk (`Inputs.sink_tokens`).
      call_lse: `call_lse(inputs) -> (out float32 [B, Lq, H, D], lse float32 [B, Lq, H])`,
        differentiable in both, without sinks (`Inputs.sinks` is None): a step of context
        parallelism, which merges steps by lse and adds the sinks once. None: not a step.
      materialises_scores: holds [B, H, Lq, Lk] (memory quadratic in the length).
      auto_priority: the order "auto" tries it in (None: never chosen by "auto");
        auto_platforms: where "auto" may choose it; auto_max_scores: "auto" prefers it up to
        Lq * Lk of this (beyond, only when no other backend supports the encoding), one int
        or {platform: int} (a platform it does not name: no limit).
      check: `check(encoding, shapes) -> None | reason`, the backend's own further refusal.
      lowers: `lowers(encoding, shapes, platform) -> None | reason`: whether it lowers for
        these shapes on `platform` (asked when a platform is given, e.g. by `choose`).
    """

    name: str
    call: Callable[[Inputs], Array]
    bias: frozenset
    platforms: frozenset
    rotates_inside: bool = False
    value_term: bool = False
    block_transform: bool = False
    causal: bool = True
    bidirectional: bool = True
    gqa: bool = True
    sliding_window: bool = False
    chunked: bool = False
    sinks: bool = False
    sink_tokens: bool = False
    call_lse: Callable[[Inputs], tuple[Array, Array]] | None = None
    materialises_scores: bool = False
    auto_priority: int | None = None
    auto_platforms: frozenset = frozenset()
    auto_max_scores: int | Mapping[str, int] | None = None
    check: Callable[[Encoding, Shapes | None], str | None] | None = None
    lowers: Callable[[Encoding, Shapes, str], str | None] | None = None

    def supports(self, encoding: Encoding, *, causal: bool = True, shapes: Shapes | None = None,
                 platform: str | None = None) -> str | None:
        """None when this backend can run `encoding` (with these masks, shapes, platform),
        else the reason, naming the encoding, this backend and the alternatives."""
        name, here = encoding.name, f"attention={self.name!r}"
        if isinstance(encoding, cap.CausalOnly) and not causal:
            return (f"encoding {name!r} is defined for causal attention only; got causal=False "
                    "(use causal=True or another encoding)")
        if platform is not None and platform not in self.platforms:
            return f"{here} does not lower for platform {platform!r} (only {sorted(self.platforms)})"
        if not (self.causal if causal else self.bidirectional):
            return f"{here} does not support causal={causal}"
        if shapes is not None and (reason := self._masks(shapes)) is not None:
            return reason
        if shapes is not None and shapes.heads != shapes.kv_heads and not self.gqa:
            return f"{here} does not support grouped-query attention (H != K)"
        kind = bias_kind(encoding)
        missing = kind is not None and kind not in self.bias
        if missing and kind == "rows":  # before the backend's own check: the deeper reason
            return self._refuse_bias(name, kind)
        if self.check is not None and (reason := self.check(encoding, shapes)) is not None:
            return reason
        if missing:
            return self._refuse_bias(name, kind)
        if self.lowers is not None and platform is not None and shapes is not None:
            if (reason := self.lowers(encoding, shapes, platform)) is not None:
                return reason
        for wanted, has, what in ((cap.ValueTerm, self.value_term, "a value term"),
                                  (cap.BlockTransform, self.block_transform, "a block transform")):
            if isinstance(encoding, wanted) and not has:
                return (f"encoding {name!r} declares {what}, which {here} does not apply; use "
                        f"attention={_alternatives(lambda b, a=what: _applies(b, a))}")
        return None

    def _masks(self, shapes: Shapes) -> str | None:
        """The reason this backend cannot take the window / chunks / sinks of `shapes`."""
        here = f"attention={self.name!r}"
        for given, has, what in (
                (shapes.window is not None, "sliding_window", f"window={shapes.window}"),
                (shapes.chunk_size is not None, "chunked", f"chunk_size={shapes.chunk_size}"),
                (shapes.sinks, "sinks", "sinks (learned sink logits)"),
                (bool(shapes.sink_tokens), "sink_tokens", f"sink_tokens={shapes.sink_tokens}")):
            if given and not getattr(self, has):
                return (f"{here} does not support {what}; use attention="
                        f"{_alternatives(lambda b, a=has: getattr(b, a))}")
        return None

    def _refuse_bias(self, name: str, kind: str) -> str:
        return (f"encoding {name!r} {BIAS_KINDS[kind]}, which attention={self.name!r} does not "
                f"compute; use attention={_alternatives(lambda b: kind in b.bias)}")


def _applies(backend: Backend, what: str) -> bool:
    return backend.value_term if what == "a value term" else backend.block_transform


def _alternatives(ok: Callable[[Backend], bool]) -> str:
    """The backends that lower on every platform and pass `ok`, as "'a' or 'b'"."""
    found = [repr(b.name) for b in _REGISTRY.values() if ok(b) and set(PLATFORMS) <= b.platforms]
    return " or ".join(found) if found else "another encoding"


def register(backend: Backend) -> Backend:
    """Adds a record; ValueError for a taken name, "auto", or an unknown platform/bias kind."""
    if not isinstance(backend, Backend):
        raise TypeError(f"register takes a Backend record, got {type(backend).__name__}")
    if backend.name in _REGISTRY or backend.name == AUTO:
        raise ValueError(f"attention backend name {backend.name!r} is already taken")
    unknown = (set(backend.platforms) | set(backend.auto_platforms)) - set(PLATFORMS)
    if unknown or not set(backend.bias) <= set(BIAS_KINDS):
        raise ValueError(f"backend {backend.name!r}: unknown platforms {sorted(unknown)} or "
                         f"bias kinds {sorted(set(backend.bias) - set(BIAS_KINDS))}; valid: "
                         f"{PLATFORMS}, {tuple(BIAS_KINDS)}")
    _REGISTRY[backend.name] = backend
    return backend


def names() -> tuple[str, ...]:
    """The registered backend names, in registration order (without "auto")."""
    return tuple(_REGISTRY)


def get(name: str) -> Backend:
    """The record of `name`; ValueError naming the valid ones (and "auto")."""
    if not isinstance(name, str) or name not in _REGISTRY:
        valid = ", ".join(map(repr, (*_REGISTRY, AUTO)))
        raise ValueError(f"unknown attention implementation {name!r}; valid implementations "
                         f"are: {valid}")
    return _REGISTRY[name]


def resolve(implementation: str) -> str:
    """`implementation` when it names a backend or "auto"; ValueError naming the valid ones."""
    if implementation != AUTO:
        get(implementation)
    return implementation


def host_platform() -> str | None:
    """The accelerator this process runs on ("cuda", "tpu"), or None on a CPU host."""
    return {"gpu": "cuda", "tpu": "tpu"}.get(jax.default_backend())


def check(name: str, encoding: Encoding, *, causal: bool = True,
          shapes: Shapes | None = None, platform: str | None = None, lse: bool = False
          ) -> None:
    """ValueError unless `name` (a backend or "auto") can run `encoding` (on `platform` when
    given: then a backend's `lowers` is asked too, e.g. the kernel's trial lowering on the
    host's accelerator; `lse`: as a context-parallel step)."""
    if name == AUTO:
        choose(encoding, causal=causal, shapes=shapes, platform=platform or "cpu", lse=lse)
        return
    backend = get(name)
    reason = backend.supports(encoding, causal=causal, shapes=shapes, platform=platform)
    if reason is None and lse and backend.call_lse is None:
        reason = (f"attention={name!r} cannot be a context-parallel step (no call_lse); use "
                  f"{_alternatives(lambda b: b.call_lse is not None)}")
    if reason is not None:
        raise ValueError(reason)


def choose(encoding: Encoding, *, causal: bool, shapes: Shapes | None, platform: str,
           lse: bool = False) -> Backend:
    """What "auto" runs on `platform`: the first record by `auto_priority` that may be chosen
    there and supports the encoding within its `auto_max_scores`; else the first that supports
    it at all (with `lse`: among the records with a `call_lse`, context parallelism's steps).
    ValueError (the first candidate's reason) when none does."""
    ranked = sorted((b for b in _REGISTRY.values() if b.auto_priority is not None
                     and platform in b.auto_platforms and (b.call_lse or not lse)),
                    key=lambda b: b.auto_priority)
    scores = None if shapes is None else shapes.q_len * shapes.k_len
    able = [b for b in ranked
            if b.supports(encoding, causal=causal, shapes=shapes, platform=platform) is None]
    for b in able:
        limit = b.auto_max_scores
        if isinstance(limit, Mapping):
            limit = limit.get(platform)
        if limit is None or scores is None or scores <= limit:
            return b
    if able:
        return able[0]
    raise ValueError(ranked[0].supports(encoding, causal=causal, shapes=shapes,
                                        platform=platform) if ranked
                     else f"no attention backend can be chosen on {platform!r}")


def run(name: str, encoding: Encoding, operands: tuple, body: Callable[[Backend, Any], Any],
        *, causal: bool, shapes: Shapes, lse: bool = False) -> Any:
    """`body(record, operands)` for backend `name` (checked first: ValueError with the
    record's reason); for "auto", the record `choose` picks on the platform lowered for (one
    `jax.lax.platform_dependent` when the platforms differ). `lse`: only records with a
    `call_lse` (context parallelism's steps)."""
    if name != AUTO:
        check(name, encoding, causal=causal, shapes=shapes, lse=lse)
        return body(get(name), operands)
    picks: Mapping[str, Backend] = {p: choose(encoding, causal=causal, shapes=shapes,
                                              platform=p, lse=lse) for p in PLATFORMS}
    default = picks["cpu"]
    if all(b is default for b in picks.values()):
        return body(default, operands)
    branches = {p: (lambda ops, b=b: body(b, ops)) for p, b in picks.items() if b is not default}
    return jax.lax.platform_dependent(operands, default=lambda ops: body(default, ops),
                                      **branches)
