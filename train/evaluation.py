"""Evaluation and loading trained models: what the study and notebooks call.

    evaluate(model, stream, *, seq_len, num_tokens, batch_size) -> {loss, ppl, tokens}
    evaluate_params(graphdef, params, stream, *, seq_len, num_tokens, batch_size, mesh, rules)
    load_model(workdir, *, step=None, model_overrides=None, mesh=None) -> (model, config)

Scoring: the first `num_tokens` targets of a token stream in non-overlapping windows of
`seq_len` (`data.eval_batches`): the same tokens at every length, each window starting with no
context. Loss is the mean cross-entropy in nats per byte, in float32 per batch and summed in
float64 on the host; ppl = exp(loss).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from posenc_jax.model.transformer import complete_rules
from train import checkpoint as ckpt_lib
from train import data, sharding
from train import state as state_lib
from train import step as step_lib
from train.runtime import Runtime


def evaluate_params(graphdef, params, stream, *, seq_len: int, num_tokens: int,
                    batch_size: int, mesh, rules, packed: bool = False,
                    runtime: Runtime | None = None, chunk: int = 0) -> dict[str, float]:
    """Loss/perplexity of `params` over the first `num_tokens` targets of `stream`, scored in
    non-overlapping windows of `seq_len` (see `data.eval_batches`). The eval step comes from
    `runtime` (compiled once there) or is built for this call; `chunk` > 0: the chunked loss
    (`train.step`)."""
    step = (runtime.eval_step(graphdef, mesh, tuple(rules), packed=packed, chunk=chunk)
            if runtime else step_lib.make_eval_step(graphdef, mesh, tuple(rules),
                                                    packed=packed, chunk=chunk))
    row_index, row_count = sharding.local_rows(mesh, batch_size)
    sums = []
    for local in data.eval_batches(stream, seq_len=seq_len, num_tokens=num_tokens,
                                   batch_size=batch_size, packed=packed,
                                   process_index=row_index, process_count=row_count):
        sums.append(step(params, sharding.global_batch(mesh, local,
                                                       global_batch_size=batch_size)))
    host = np.asarray(jax.device_get(sums), dtype=np.float64)  # [batches, 2]
    loss_sum, weight = host[:, 0].sum(), host[:, 1].sum()
    loss = loss_sum / max(weight, 1.0)
    return {"loss": float(loss), "ppl": float(np.exp(loss)), "tokens": round(weight)}


def _mesh_of(params) -> Any:
    for leaf in jax.tree.leaves(params):
        sh = getattr(leaf, "sharding", None)
        if isinstance(sh, jax.sharding.NamedSharding):
            return sh.mesh
    return None


def evaluate(model: nnx.Module, stream, *, seq_len: int, num_tokens: int, batch_size: int,
             packed: bool = False, mesh=None, rules=None) -> dict[str, float]:
    """{loss, ppl, tokens} of an NNX model over `num_tokens` targets of a `data.TokenStream`.

    Runs on `mesh` (default: the mesh the params live on, else all devices as `data`) with
    the batch split over (data, fsdp); `batch_size` must be divisible by that split.
    """
    graphdef, params = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(params)
    mesh = mesh or _mesh_of(params) or sharding.make_mesh({"data": -1})
    if rules is None:  # data parallel activations; params stay where they are
        rules = complete_rules((("batch", sharding.BATCH_AXES),))
    return evaluate_params(graphdef, params, stream, seq_len=seq_len, num_tokens=num_tokens,
                           batch_size=batch_size, mesh=mesh, rules=sharding.normalize_rules(rules),
                           packed=packed)


def load_model(workdir: str, *, step: int | None = None, model_overrides=None, mesh=None,
               devices=None, config=None) -> tuple[nnx.Module, Any]:
    """The model saved in `workdir` (newest readable step, or `step`), and its config.

    The config is read from the checkpoint unless given. `model_overrides` replace
    `TransformerConfig` fields while keeping the trained weights (e.g. `{"encoding_kwargs":
    {"scaling": {...}}}` for zero-shot RoPE scaling; the parameter shapes must not change).
    The parameters are placed on `mesh` (default: the config's mesh over `devices`).
    """
    setup, params, config = load_params(workdir, step=step, model_overrides=model_overrides,
                                        mesh=mesh, devices=devices, config=config)
    return state_lib.merge_model(setup, params), config


def load_params(workdir: str, *, step: int | None = None, model_overrides=None, mesh=None,
                devices=None, config=None, runtime: Runtime | None = None
                ) -> tuple[Any, Any, Any]:
    """`(setup, params, config)` from the checkpoint in `workdir` (the full params the model
    runs with: LoRA adapters merged): `load_model` without building the module (what an evaluation that swaps encodings on the same weights needs).
    The setup comes from `runtime` when given."""
    directory = os.path.join(os.path.abspath(workdir), ckpt_lib.CHECKPOINT_DIR)
    ckpt = ckpt_lib.Checkpointer(directory, async_save=False, read_only=True)
    try:
        if config is None:
            steps = ckpt.all_steps()
            if not steps:
                raise FileNotFoundError(f"no checkpoint in {directory}")
            meta = ckpt.restore_meta(step or steps[-1])
            config = ml_collections.ConfigDict(meta["config"])
        mesh = mesh or sharding.make_mesh(config.mesh, devices=devices)
        setup = (runtime.setup(config, mesh, model_overrides=model_overrides) if runtime
                 else state_lib.make_setup(config, mesh, model_overrides=model_overrides))
        if step is None:
            restored = ckpt.restore_latest(setup.abstract)
            if restored is None:
                raise FileNotFoundError(f"no checkpoint in {directory}")
        else:
            restored = ckpt.restore(step, setup.abstract)
    finally:
        ckpt.close()
    return setup, setup.full_params(restored[0]), config
