"""LoRA adapters on the model's projections, as pure transforms of the params pytree.

    adapters = lora.init(params, rank=8, targets=("q_proj", "v_proj"), key=key)
    merged = lora.merge(params, adapters, rank=8, alpha=16.0)      # same tree as params
    logits = nnx.merge(graphdef, merged)(tokens)

LoRA (Hu et al. 2021) keeps a weight W frozen and trains a low-rank update: W' = W +
(alpha / r) * A @ B with A [I, r] and B [r, O], where I is the product of W's input axes and O
of its output axes. B starts at zero, so the adapted model starts as the base model. The
model is never touched: `merge` returns a new params pytree (a pure dict as
`nnx.to_pure_dict` gives) with each targeted weight replaced by W'; under `jax.grad` the
gradient reaches only the adapters when the base is held constant. Merging for export is the
same call outside the train step.

Targets are the projections' leaf names (`TARGETS`: attention q/k/v/o, the MLP's gate, up,
down); `input_axes` says how many leading axes of each are inputs: q/k/v [E, H, D] (1),
o [H, D, E] (2), gate/up [E, F] (1), down [F, E] (1). A mixture of experts' stacked gate / up
/ down [X, ...] (`posenc_jax.model.moe`) get one adapter per expert: A [X, I, r], B [X, r, O].

Adapters are a nested dict with the params' structure down to each targeted weight, whose
leaf becomes `{"a": [I, r], "b": [r, O]}` in `dtype` (float32 by default, whatever the
base's dtype; the update is cast to the weight's dtype when merged).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from posenc_jax.checks import finite_float, positive_int

__all__ = ["TARGETS", "init", "merge", "num_params", "targeted_paths"]

Array = jax.Array

#: Leaf name of each projection LoRA can adapt -> how many leading axes are its inputs.
TARGETS = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "gate": 1, "up": 1,
           "down": 1}


def _check_targets(targets: Sequence[str]) -> tuple[str, ...]:
    if isinstance(targets, str) or not isinstance(targets, Sequence) or not targets:
        raise TypeError(f"targets must be a non-empty sequence of projection names, got "
                        f"targets={targets!r}; valid: {', '.join(TARGETS)}")
    bad = [t for t in targets if t not in TARGETS]
    if bad:
        raise ValueError(f"targets={tuple(targets)!r} names {bad[0]!r}, which is not a "
                         f"projection LoRA adapts; valid: {', '.join(TARGETS)}")
    return tuple(targets)


def _walk(tree: Any, path: tuple = ()):
    """(path, leaf) for every leaf of a nested mapping (an empty mapping is a leaf)."""
    if isinstance(tree, Mapping) and tree:
        for key, value in tree.items():
            yield from _walk(value, (*path, key))
    else:
        yield path, tree


def targeted_paths(params: Mapping, targets: Sequence[str]) -> list[tuple]:
    """Paths (tuples of keys) of the weights in `params` whose leaf name is in `targets`;
    a ValueError when none is found (naming the targets)."""
    targets = _check_targets(targets)
    paths = [p for p, _ in _walk(params) if p and p[-1] in targets]
    if not paths:
        raise ValueError(f"targets={targets!r}: the params hold none of these projections")
    return paths


def _set(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get(tree: Mapping, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _io(shape: tuple[int, ...], name: str) -> tuple[tuple[int, ...], int, int]:
    """(expert axes: (X,) for a MoE's stacked [X, E, F] gate / up / down, else (), I, O)."""
    lead = shape[:1] if name in ("gate", "up", "down") and len(shape) == 3 else ()
    n = len(lead) + TARGETS[name]
    return lead, math.prod(shape[len(lead):n]), math.prod(shape[n:])


def init(params: Mapping, *, rank: int, targets: Sequence[str], key: Array,
         dtype: Any = jnp.float32) -> dict:
    """Adapters for every targeted weight of `params` (a pure dict of arrays or
    ShapeDtypeStructs): A ~ N(0, 1 / I) [I, r], B = 0 [r, O], in `dtype`."""
    rank = positive_int("rank", rank)
    paths = targeted_paths(params, targets)
    out: dict = {}
    for i, path in enumerate(paths):
        lead, n_in, n_out = _io(tuple(_get(params, path).shape), path[-1])
        if rank > min(n_in, n_out):
            raise ValueError(f"rank={rank} exceeds the smaller side of "
                             f"{'/'.join(map(str, path))} ({n_in} x {n_out})")
        a = jax.random.normal(jax.random.fold_in(key, i), (*lead, n_in, rank), dtype)
        _set(out, path, {"a": a / jnp.sqrt(jnp.asarray(n_in, dtype)),
                         "b": jnp.zeros((*lead, rank, n_out), dtype)})
    return out


def merge(params: Mapping, adapters: Mapping, *, rank: int, alpha: float) -> dict:
    """A copy of `params` with each adapted weight W replaced by W + (alpha / rank) A @ B
    (computed in float32, cast to W's dtype). Leaves without an adapter are the same arrays."""
    scale = finite_float("alpha", alpha) / positive_int("rank", rank)
    merged: dict = {}
    for path, w in _walk(params):
        try:
            ab = _get(adapters, path)
        except (KeyError, TypeError):
            ab = None
        if ab is not None:
            delta = jnp.einsum("...ir,...ro->...io", ab["a"].astype(jnp.float32),
                               ab["b"].astype(jnp.float32))
            w = (w.astype(jnp.float32) + scale * delta.reshape(w.shape)).astype(w.dtype)
        _set(merged, path, w)
    return merged


def num_params(adapters: Mapping) -> int:
    """How many numbers the adapters hold."""
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(adapters))
