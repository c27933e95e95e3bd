"""The jitted, sharded train and eval steps.

Loss: mean next-token cross-entropy over weighted targets, in float32 whatever the model's
compute dtype:  sum_{b,l} w[b,l] * CE(logits[b,l], targets[b,l]) / sum w.  With gradient
accumulation the batch's rows are split into A interleaved microbatches (row r goes to
microbatch r mod A, so each device keeps working on its own rows), the weighted sums and
their gradients are accumulated by a `lax.scan`, and the division happens once: the update is
the same as without accumulation, up to float rounding.

`loss_chunk` (config key, 0 = off): the loss is `posenc_jax.model.loss.chunked_cross_entropy`
over the model's hidden states and head, `loss_chunk` positions at a time, so the [B, L, V]
logits never exist (equal values and gradients); 0 takes the full logits.

The step differentiates only `state["params"]` (what trains: `train.trainable`); the model
runs with `setup.full_params(state)` (the frozen base and merged LoRA adapters).

Mixture of experts: with `moe_aux_loss_coef` c > 0 the train loss is CE + c * the model's
load-balancing loss (`Transformer.hidden_states_and_aux`, the MoE layers' mean), weighted like
a mean over the batch's targets; the metric `moe_aux_loss` logs the unscaled loss (models with
MoE layers only). Evaluation reports the CE alone.

Batches are dicts of [B, L] arrays: inputs, targets, positions (int32), segment_ids (int32;
used only when `packed`), weights (float32).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from posenc_jax.model.loss import chunked_cross_entropy
from train import sharding
from train.state import TrainSetup, merge_model, mesh_context

BATCH_KEYS = ("inputs", "targets", "positions", "segment_ids", "weights")


def weighted_xent(logits: jax.Array, targets: jax.Array, weights: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
    """(sum of w * CE, sum of w), float32 scalars. logits [B, L, V], targets/weights [B, L]."""
    logits = logits.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    weights = weights.astype(jnp.float32)
    return jnp.sum(ce * weights), jnp.sum(weights)


def loss_sums(graphdef: Any, params: Any, batch: dict[str, jax.Array], *, packed: bool,
              chunk: int = 0) -> tuple[jax.Array, jax.Array]:
    """Forward pass: (weighted CE sum, weight sum) for one batch; `chunk` > 0: the chunked
    loss (no [B, L, V] logits), 0: the full logits."""
    loss_sum, (weight_sum, _) = train_sums(graphdef, params, batch, packed=packed, chunk=chunk,
                                           aux_coef=0.0)
    return loss_sum, weight_sum


def train_sums(graphdef: Any, params: Any, batch: dict[str, jax.Array], *, packed: bool,
               chunk: int = 0, aux_coef: float | None = None
               ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """(CE sum + c * aux * weight sum, (weight sum, aux * weight sum)): `loss_sums` plus the
    MoE load-balancing loss aux (0 for a dense model), c = `aux_coef` (None: the model's
    `moe_aux_loss_coef`)."""
    model = merge_model(graphdef, params)
    segment_ids = batch["segment_ids"] if packed else None
    coef = model.config.moe_aux_loss_coef if aux_coef is None else aux_coef
    if model.config.num_experts:
        hidden, aux = model.hidden_states_and_aux(batch["inputs"], batch["positions"],
                                                  segment_ids=segment_ids)
        loss_sum, weight_sum = (
            chunked_cross_entropy(model.head, hidden, batch["targets"], batch["weights"],
                                  chunk=chunk) if chunk else
            weighted_xent(model.head(hidden), batch["targets"], batch["weights"]))
        return loss_sum + coef * aux * weight_sum, (weight_sum, aux * weight_sum)
    zero = jnp.zeros((), jnp.float32)
    if chunk:
        hidden = model.hidden_states(batch["inputs"], batch["positions"],
                                     segment_ids=segment_ids)
        loss_sum, weight_sum = chunked_cross_entropy(model.head, hidden, batch["targets"],
                                                     batch["weights"], chunk=chunk)
        return loss_sum, (weight_sum, zero)
    logits = model(batch["inputs"], batch["positions"], segment_ids=segment_ids)
    loss_sum, weight_sum = weighted_xent(logits, batch["targets"], batch["weights"])
    return loss_sum, (weight_sum, zero)


def _grads(setup: TrainSetup, state, batch, *, packed: bool, accum_steps: int, chunk: int):
    params = state["params"]

    def f(p, b):
        full = setup.full_params({**state, "params": p})
        return train_sums(setup.graphdef, full, b, packed=packed, chunk=chunk)

    grad_fn = jax.value_and_grad(f, has_aux=True)
    if accum_steps == 1:
        (loss_sum, sums), grads = grad_fn(params, batch)
        return loss_sum, sums, grads

    def split(x):  # [B, ...] -> [A, B / A, ...], microbatch a = rows a, a + A, a + 2A, ...
        x = x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:])
        x = jnp.moveaxis(x, 1, 0)
        spec = P(None, *sharding.batch_sharding(setup.mesh, x.ndim - 1).spec)
        return jax.lax.with_sharding_constraint(x, NamedSharding(setup.mesh, spec))

    micro = jax.tree.map(split, batch)

    def body(carry, mb):
        loss_sum, sums, grads = carry
        (ls, s), g = grad_fn(params, mb)
        return (loss_sum + ls, jax.tree.map(jnp.add, sums, s),
                jax.tree.map(jnp.add, grads, g)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    zero = jnp.zeros((), jnp.float32)
    (loss_sum, sums, grads), _ = jax.lax.scan(body, (zero, (zero, zero), zeros), micro)
    return loss_sum, sums, grads


def make_train_step(setup: TrainSetup, *, packed: bool = False, accum_steps: int = 1,
                    chunk: int = 0) -> Callable[[dict, dict], tuple[dict, dict]]:
    """`step(state, batch) -> (state, metrics)`, jitted with the state's shardings, the state
    donated, the batch split over (data, fsdp). Metrics (float32 scalars, replicated): loss,
    grad_norm, learning_rate (of this update), weight (the number of scored targets), and for a
    model with MoE layers moe_aux_loss (module docstring). `chunk`: the loss chunk (module
    docstring). Frozen params pass through unchanged.
    A new function on every call (compiled on first use); `train.runtime.Runtime.train_step`
    keeps them for reuse. `step.lower(state, batch)` lowers it (ShapeDtypeStructs will do)."""

    def train_step(state, batch):
        params = state["params"]
        loss_sum, (weight_sum, aux_sum), grads = _grads(
            setup, state, batch, packed=packed, accum_steps=accum_steps, chunk=chunk)
        denom = jnp.maximum(weight_sum, 1.0)
        grads = jax.tree.map(lambda g: (g / denom).astype(g.dtype), grads)
        updates, opt_state = setup.tx.update(grads, state["opt_state"], params)
        new_state = {**state, "params": optax.apply_updates(params, updates),
                     "opt_state": opt_state, "step": state["step"] + 1}
        metrics = {"loss": loss_sum / denom, "grad_norm": optax.tree.norm(grads),
                   "learning_rate": setup.schedule(state["step"]), "weight": weight_sum}
        if setup.model_config.num_experts:
            metrics["moe_aux_loss"] = aux_sum / denom
        return new_state, metrics

    batch_sh = {k: sharding.batch_sharding(setup.mesh, 2) for k in BATCH_KEYS}
    replicated = sharding.replicated(setup.mesh)
    jitted = jax.jit(train_step, in_shardings=(setup.shardings, batch_sh),
                     out_shardings=(setup.shardings, replicated), donate_argnums=(0,))

    def step(state, batch):
        with setup.context():
            return jitted(state, {k: batch[k] for k in BATCH_KEYS})

    def lower(state, batch):  # for compiled memory analysis (benchmarks/finetune_memory.py)
        with setup.context():
            return jitted.lower(state, {k: batch[k] for k in BATCH_KEYS})

    step.lower = lower
    return step


def make_eval_step(graphdef: Any, mesh, rules, *, packed: bool = False, chunk: int = 0
                   ) -> Callable[[Any, dict], tuple]:
    """`eval_step(params, batch) -> (loss_sum, weight_sum)`, float32, replicated. Params (the
    full params the model runs with) stay where they are; the batch is split over (data,
    fsdp); `chunk` as in the train step. A new function on every call;
    `train.runtime.Runtime.eval_step` keeps them for reuse."""

    def eval_step(params, batch):
        return loss_sums(graphdef, params, batch, packed=packed, chunk=chunk)

    batch_sh = {k: sharding.batch_sharding(mesh, 2) for k in BATCH_KEYS}
    jitted = jax.jit(eval_step, in_shardings=(None, batch_sh),
                     out_shardings=sharding.replicated(mesh))

    def step(params, batch):
        with mesh_context(mesh, rules):
            return jitted(params, {k: batch[k] for k in BATCH_KEYS})

    return step
