"""Passkey retrieval accuracy of trained params on a `train.datasets.passkey` eval set.

    passkey_accuracy(graphdef, params, evalset, *, mesh, rules, batch_size) -> dict

Each document is read whole (positions 0 .. n-1, no packing) and the key counts as retrieved
when the model's argmax at each of the key's `digits` positions is the key's digit given the
digits before it (teacher forcing). That is exactly "greedy decoding after the question writes
the key": a greedy decode stays on the teacher-forced path as long as it is right, so both
agree on every document. accuracy = retrieved documents / trials.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax import checks
from train import sharding
from train.datasets.passkey import EvalSet
from train.state import merge_model, mesh_context


def _predict_fn(graphdef: Any, mesh, rules, *, digits: int):
    """jit: (params, inputs int32 [B, n]) -> int32 [B, digits], the argmax predictions for
    the last `digits` tokens (read at positions n - digits - 1 .. n - 2)."""

    def predict(params, inputs):
        model = merge_model(graphdef, params)
        positions = jnp.broadcast_to(jnp.arange(inputs.shape[1], dtype=jnp.int32),
                                     inputs.shape)
        logits = model(inputs, positions)[:, -digits - 1:-1]
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    jitted = jax.jit(predict, in_shardings=(None, sharding.batch_sharding(mesh, 2)),
                     out_shardings=sharding.replicated(mesh))

    def run(params, inputs):
        with mesh_context(mesh, rules):
            return jitted(params, inputs)

    return run


def passkey_accuracy(graphdef: Any, params: Any, evalset: EvalSet, *, mesh, rules,
                     batch_size: int) -> dict[str, Any]:
    """{accuracy, correct, trials, digit_accuracy} of `params` on `evalset`.

    Rows are scored `batch_size` at a time (rounded up to a multiple of the mesh's batch
    shards; the last batch is padded by repeating documents, whose results are dropped).
    One process holds the whole batch (single-host evaluation, like the study's).
    """
    checks.positive_int("batch_size", batch_size)
    shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
    trials = evalset.tokens.shape[0]
    rows = -(-min(batch_size, trials) // shards) * shards
    predict = _predict_fn(graphdef, mesh, tuple(rules), digits=evalset.digits)
    tokens = evalset.tokens.astype(np.int32)
    predictions = []
    for first in range(0, trials, rows):
        index = np.arange(first, first + rows) % trials
        batch = jax.device_put(tokens[index], sharding.batch_sharding(mesh, 2))
        predictions.append(predict(params, batch)[: min(rows, trials - first)])
    predicted = np.concatenate(jax.device_get(predictions), axis=0)
    hits = predicted == evalset.keys.astype(np.int32)           # [T, digits]
    correct = int(hits.all(axis=1).sum())
    return {"accuracy": correct / trials, "correct": correct, "trials": int(trials),
            "digit_accuracy": float(hits.mean())}
