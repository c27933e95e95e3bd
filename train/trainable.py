"""What a run trains: every parameter, or LoRA adapters on a frozen base (`config.lora`).

    spec = trainable.from_config(config)                    # a `Trainable`
    trained, frozen = trainable.split(params, spec, key=key)
    params = trainable.compose(spec, trained, frozen)       # what the model runs with

The train state keeps the two parts apart: `state["params"]` is what trains (the optimizer
holds moments for it alone) and `state["frozen"]` the rest, never updated (absent when
everything trains, so checkpoints of full runs keep their old shape). With LoRA:

    trained = {"adapters": posenc_jax.model.lora adapters,
               "base": the base params that also train (LongLoRA: norms, embeddings), or {}}
    frozen  = every other base param

`compose` puts the base back together and merges the adapters (`lora.merge`): the model runs
with W + (alpha / r) A @ B, and the gradient reaches only `trained`. Export uses the same
`compose`, so the written model is the adapted one.

Config block `lora` (absent or enabled=False: everything trains):
  enabled            LoRA on a frozen base
  rank, alpha        r and alpha of W + (alpha / r) A @ B
  targets            comma-separated projection names (`lora.TARGETS`)
  train_norms        every norm scale trains too (LongLoRA)
  train_embeddings   the token embedding trains too (LongLoRA)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
from flax import traverse_util

from posenc_jax import checks
from posenc_jax.model import lora


@dataclasses.dataclass(frozen=True)
class Trainable:
    """Which parameters train (see the module docstring); `lora=False`: all of them."""

    lora: bool = False
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    train_norms: bool = False
    train_embeddings: bool = False

    def base_trains(self, path: tuple) -> bool:
        """Whether the base param at `path` trains (always, without LoRA)."""
        if not self.lora:
            return True
        norm = any(isinstance(k, str) and k.endswith("norm") for k in path)
        return (self.train_norms and norm) or (self.train_embeddings and path[0] == "embedding")


def from_config(config) -> Trainable:
    """The `Trainable` of `config.lora` (TypeError/ValueError naming `config.lora.<key>`)."""
    block = config.get("lora")
    if block is None or not checks.boolean("config.lora.enabled", block.get("enabled", False)):
        return Trainable()
    targets = block.get("targets", "q_proj,k_proj,v_proj,o_proj")
    if not isinstance(targets, str):
        raise TypeError(f"config.lora.targets must be a comma-separated string, got "
                        f"config.lora.targets={targets!r}")
    names = tuple(t.strip() for t in targets.split(",") if t.strip())
    bad = [t for t in names if t not in lora.TARGETS] or ([""] if not names else [])
    if bad:
        raise ValueError(f"config.lora.targets={targets!r} names {bad[0]!r}, not a projection "
                         f"LoRA adapts; valid: {', '.join(lora.TARGETS)}")
    return Trainable(
        lora=True, rank=checks.positive_int("config.lora.rank", block.get("rank", 8)),
        alpha=checks.finite_float("config.lora.alpha", block.get("alpha", 16.0), above=0.0),
        targets=names,
        train_norms=checks.boolean("config.lora.train_norms", block.get("train_norms", False)),
        train_embeddings=checks.boolean("config.lora.train_embeddings",
                                        block.get("train_embeddings", False)))


def _partition(params: Mapping, keep) -> tuple[dict, dict]:
    flat = traverse_util.flatten_dict(dict(params), keep_empty_nodes=True)
    yes = {p: v for p, v in flat.items() if keep(p)}
    no = {p: v for p, v in flat.items() if not keep(p)}
    return traverse_util.unflatten_dict(yes), traverse_util.unflatten_dict(no)


def _combine(a: Mapping, b: Mapping) -> dict:
    flat = traverse_util.flatten_dict(dict(a), keep_empty_nodes=True)
    flat.update(traverse_util.flatten_dict(dict(b), keep_empty_nodes=True))
    return traverse_util.unflatten_dict(flat)


def split(params: Mapping, spec: Trainable, *, key: jax.Array) -> tuple[dict, dict]:
    """(trained, frozen) from the full params (a pure dict of arrays, or ShapeDtypeStructs
    under `jax.eval_shape`); `key` draws the adapters' A."""
    if not spec.lora:
        return dict(params), {}
    base, frozen = _partition(params, spec.base_trains)
    adapters = lora.init(params, rank=spec.rank, targets=spec.targets, key=key)
    return {"adapters": adapters, "base": base}, frozen


def compose(spec: Trainable, trained: Mapping, frozen: Mapping | None) -> dict[str, Any]:
    """The full params the model runs with (the adapters merged into the base)."""
    if not spec.lora:
        return dict(trained)
    base = _combine(frozen or {}, trained["base"])
    return lora.merge(base, trained["adapters"], rank=spec.rank, alpha=spec.alpha)


def shardings_like(tree: Mapping, param_sh: Mapping, replicated) -> dict:
    """Shardings for a `split` part: a base param's own sharding, `replicated` for the
    adapters (small: r columns)."""
    flat_sh = traverse_util.flatten_dict(dict(param_sh), keep_empty_nodes=True)
    flat = traverse_util.flatten_dict(dict(tree), keep_empty_nodes=True)
    out = {}
    for path, leaf in flat.items():
        if leaf is traverse_util.empty_node:
            out[path] = leaf
        elif path[0] == "adapters":
            out[path] = replicated
        else:
            out[path] = flat_sh[path[1:] if path[0] == "base" else path]
    return traverse_util.unflatten_dict(out)
