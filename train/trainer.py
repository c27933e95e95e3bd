"""Training and evaluation: the loop tests and the study call, `__main__` is a thin shell.

Public API (the last three live in `train.evaluation`):
    train_and_evaluate(config, workdir, *, devices=None, runtime=None) -> dict  train (resuming), evaluate
    evaluate(model, stream, *, seq_len, num_tokens, batch_size, ...) -> {loss, ppl, tokens}
    evaluate_params(graphdef, params, stream, *, ..., mesh, rules)   the same on raw params
    load_model(workdir, *, step=None, model_overrides=None, mesh=None) -> (model, config)

Steps count updates: "step S" is the state after S updates, its checkpoint, and the metrics
line of the S-th update (whose loss is that of the batch of index S - 1, before the update).
The batch of index s is `data.train_batch(stream, step=s, ...)`, a pure function of
(seed, s): a run resumed from step S sees exactly the batches of an uninterrupted run, so
its parameters end bit-identical (on CPU, same mesh).

Starting point: random weights from `config.model`, or a pretrained checkpoint
(`config.init.checkpoint`: `train.from_checkpoint`, the architecture from the checkpoint);
what trains: everything or LoRA adapters (`config.lora`: `train.trainable`); text read through
the checkpoint's tokenizer with `config.dataset.tokenizer='checkpoint'`; the loss chunked with
`config.loss_chunk`; the extension study's measures with `config.eval.extension`
(`train.extension_eval`). configs/extend_finetune.py sets all of these up.

Faults: SIGTERM (or the JAX preemption notice on several hosts) -> a checkpoint at the next
step boundary, then a normal return with `preempted=True`. A non-finite loss or gradient
norm -> `NonFiniteLossError` naming the step; the state it produced is never saved, so the
last checkpoint in the workdir is the last good one. Losses are checked one step late, so
the host never waits for the device except at log, eval and checkpoint steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import threading
import time
import warnings
from typing import Any

import jax
from jax.experimental import multihost_utils

from posenc_jax.model.config import TransformerConfig
from train import checkpoint as ckpt_lib
from train import config_check, data, extension_eval, from_checkpoint, sharding
from train import metrics as metrics_lib
from train import state as state_lib
from train.datasets.tokenized import check_vocabulary
from train.evaluation import evaluate, evaluate_params, load_model  # noqa: F401 (public API)
from train.runtime import Runtime
from train.workdir_lock import WorkdirBusyError, WorkdirError, WorkdirLock, checked_workdir

CHECKPOINT_DIR = ckpt_lib.CHECKPOINT_DIR


class NonFiniteLossError(FloatingPointError):
    """The loss or gradient norm became NaN or infinite; training stopped."""


class _Preemption:
    """SIGTERM -> a flag read at step boundaries (several processes: JAX's sync point)."""

    def __init__(self):
        self.flag = False
        self._old = None
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        del signum, frame
        self.flag = True

    def reached(self, step: int) -> bool:
        if jax.process_count() > 1:
            try:  # every process agrees on the step at which to stop
                return bool(multihost_utils.reached_preemption_sync_point(step))
            except RuntimeError:  # jax_enable_preemption_service is off
                return False
        return self.flag

    def close(self):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
            self._old = None


class ConfigMismatchError(ValueError):
    """The workdir holds checkpoints of another model; nothing in it was changed."""


#: Errors whose message is the whole story (the CLI prints it without a traceback).
USER_ERRORS = (WorkdirBusyError, WorkdirError, ConfigMismatchError,
               ckpt_lib.CheckpointSaveError,
               ckpt_lib.CheckpointError, NonFiniteLossError)


_MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TransformerConfig)
                   if f.default is not dataclasses.MISSING}


def _model_check(config, workdir: str):
    """check_meta for `restore_latest`: refuses a checkpoint saved with another model. A key
    the saved config lacks (one added since, e.g. `num_experts`) counts as the
    `TransformerConfig` default."""
    expected = json.loads(config.to_json_best_effort())["model"]

    def check(step: int, meta: dict) -> None:
        saved = (meta.get("config") or {}).get("model")
        if saved is None or saved == expected:
            return
        saved = {**{k: v for k, v in _MODEL_DEFAULTS.items() if k in expected}, **saved}
        diff = [f"config.model.{k}={saved.get(k)!r} there, {expected.get(k)!r} here"
                for k in sorted(set(saved) | set(expected)) if saved.get(k) != expected.get(k)]
        if not diff:
            return
        raise ConfigMismatchError(
            f"workdir {workdir} holds a checkpoint of another model (step {step}: "
            f"{'; '.join(diff)}); nothing was changed. Rerun with the original model config, "
            "or use another --workdir")

    return check


def _finite_or_raise(step: int, values: dict, ckpt: ckpt_lib.Checkpointer) -> dict:
    host = {k: float(v) for k, v in jax.device_get(values).items()}  # one transfer
    bad = [k for k in ("loss", "grad_norm") if not math.isfinite(host[k])]
    if bad:
        ckpt.wait()
        last = ckpt.latest_step()
        where = (f"the last good checkpoint is step {last} in {ckpt.directory}" if last is not None
                 else "no checkpoint was written")
        raise NonFiniteLossError(
            f"non-finite {' and '.join(bad)} at step {step} (loss={host['loss']}, grad_norm="
            f"{host['grad_norm']}, learning_rate={host['learning_rate']:.3g}); stopped without "
            f"saving this state: {where}. Lower learning_rate or check the data.")
    return host


def _eval_all(config, setup, state, *, stream, runtime, extension=None) -> dict[str, float]:
    """Loss and perplexity at each eval length; with `extension` (tokenizer, Spec), the
    extension study's measures too (`train.extension_eval`)."""
    out = {}
    params = setup.full_params(state)
    if extension is not None:
        tokenizer, spec = extension
        model = state_lib.merge_model(setup, params)
        out.update(extension_eval.measures(model, tokenizer, stream, spec))
    for length in config.eval.lengths:
        result = evaluate_params(
            setup.graphdef, params, stream, seq_len=int(length),
            num_tokens=int(config.eval.num_tokens),
            batch_size=int(config.eval.get("batch_size") or config.batch_size), mesh=setup.mesh,
            rules=setup.rules, packed=config.dataset.packed, runtime=runtime,
            chunk=int(config.get("loss_chunk", 0) or 0))
        out[f"eval/{length}/loss"] = result["loss"]
        out[f"eval/{length}/ppl"] = result["ppl"]
    return out


def train_and_evaluate(config, workdir: str, *, devices=None,
                       runtime: Runtime | None = None, progress: bool = True) -> dict[str, Any]:
    """Trains `config` in `workdir` (resuming from its newest readable checkpoint).

    The mesh is `config.mesh` over `devices` (default: all of `jax.devices()`). Setups,
    compiled steps and token streams come from `runtime` (default: a new one for this call),
    so a caller that trains or resumes many times in one process passes its own.
    `progress=False` hides the per-step progress bar (the study shows its own).

    Returns the last logged metrics plus `step`, `preempted` and the final evaluation
    (`eval/<len>/loss`, `eval/<len>/ppl`). Raises NonFiniteLossError (see the module
    docstring), TypeError/ValueError naming the key for a bad config (before anything runs),
    WorkdirBusyError when another run holds the workdir, ConfigMismatchError (touching
    nothing) when its checkpoints belong to another model, CheckpointError when it holds only
    unreadable checkpoints, CheckpointSaveError naming the step when a save fails.
    """
    config_check.check_config(config)
    workdir = checked_workdir(workdir)  # never '' (the current directory) or a file
    mesh = sharding.make_mesh(config.mesh, devices=devices)
    shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
    micro = config.batch_size // config.get("grad_accum_steps", 1)
    if micro % shards:
        raise ValueError(f"batch_size / grad_accum_steps = {micro} rows per microbatch must be "
                         f"divisible by the mesh's data x fsdp = {shards} batch shards")
    context = sharding.context_size(mesh)
    for what, length in (("seq_len", config.seq_len),
                         *(("eval.lengths entry", n) for n in config.eval.lengths)):
        if context > 1 and int(length) % (2 * context):
            raise ValueError(f"{what}={length} must be divisible by 2 * mesh.context = "
                             f"{2 * context} (each device holds two chunks of every sequence)")
    preemption = _Preemption()  # first, so a SIGTERM during setup is not fatal
    try:
        with WorkdirLock(workdir), ckpt_lib.quiet_failed_restores():
            return _train(config, workdir, preemption, mesh, runtime or Runtime(), progress)
    finally:
        preemption.close()


def _train(config, workdir: str, preemption: _Preemption, mesh, runtime: Runtime,
           progress: bool = True) -> dict[str, Any]:
    setup = runtime.setup(config, mesh)
    tokenizer = None
    if config.dataset.get("tokenizer", "bytes") == "checkpoint":
        tokenizer = from_checkpoint.tokenizer(config)
        check_vocabulary(tokenizer, setup.model_config.vocab_size,
                         where=f"config.init.checkpoint={from_checkpoint.checkpoint_path(config)}")
    stream = runtime.stream(config.dataset, config.dataset.train_split, tokenizer=tokenizer)
    extension = _extension(config, tokenizer)
    eval_stream = (runtime.stream(config.dataset, config.dataset.eval_split,
                                  tokenizer=tokenizer)
                   if config.eval.lengths or extension else None)
    ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, CHECKPOINT_DIR),
                                 max_to_keep=config.checkpoints_to_keep,
                                 async_save=config.get("async_checkpointing", True))
    logger = None
    try:
        restored = ckpt.restore_latest(setup.abstract, check_meta=_model_check(config, workdir))
        if restored is None:
            state, start = runtime.init_state(setup, seed=config.seed), 0
        else:
            state, meta = restored
            start = int(meta["step"])
            if int(meta.get("seed", config.seed)) != config.seed:
                warnings.warn(f"resuming a run saved with seed={meta['seed']} under seed="
                              f"{config.seed}: later batches differ from the original run")
        if extension is not None and start == 0 and jax.process_index() == 0 and \
                extension_eval.load_before(workdir) is None:  # the starting model, once
            extension_eval.save_before(workdir, _eval_all(
                config, setup, state, stream=eval_stream, runtime=runtime,
                extension=extension))
        logger = metrics_lib.MetricsLogger(workdir, start_step=start,
                                           total_steps=config.num_train_steps,
                                           progress=progress)
        state, result = _loop(config, setup, state, start, stream=stream,
                              eval_stream=eval_stream, ckpt=ckpt, logger=logger,
                              preemption=preemption, runtime=runtime, extension=extension)
        ckpt.wait()
        if eval_stream is not None and not result["preempted"] and not any(
                k.startswith(("eval/", "extend/")) for k in result):
            result.update(_eval_all(config, setup, state, stream=eval_stream,
                                    runtime=runtime, extension=extension))
        if extension is not None and not result["preempted"] and jax.process_index() == 0:
            extension_eval.write_report(
                workdir, extension_eval.load_before(workdir),
                {k: v for k, v in result.items() if k.startswith(("eval/", "extend/"))},
                extension[1], title=f"Fine-tune of {from_checkpoint.checkpoint_path(config)} "
                f"({config.num_train_steps} steps at {config.seq_len} tokens): before / after")
        return result
    finally:
        if logger is not None:
            logger.close()
        ckpt.close()


def _extension(config, tokenizer):
    """(tokenizer, Spec) when `config.eval.extension` is enabled, else None."""
    path = from_checkpoint.checkpoint_path(config)
    spec = extension_eval.spec_of(config, context=from_checkpoint.original_context(config)
                                  if path else None)
    if spec is None:
        return None
    if tokenizer is None:
        raise ValueError("config.eval.extension needs the checkpoint's tokenizer "
                         "(config.dataset.tokenizer='checkpoint') for its passkey prompts")
    return tokenizer, spec


def _loop(config, setup, state, start, *, stream, eval_stream, ckpt, logger, preemption,
          runtime, extension=None):
    num_steps, batch, length = config.num_train_steps, config.batch_size, config.seq_len
    mesh = setup.mesh
    meta = {"seed": config.seed, "config": json.loads(config.to_json_best_effort()),
            "data": {"name": config.dataset.name, "identity": stream.identity}}
    row_index, row_count = sharding.local_rows(mesh, batch)
    train_step = runtime.train_step(setup, packed=config.dataset.packed,
                                    accum_steps=config.get("grad_accum_steps", 1),
                                    chunk=int(config.get("loss_chunk", 0) or 0))
    eval_every = config.get("eval_every_steps", 0) or 0
    result: dict[str, Any] = {"step": start, "preempted": False}
    pending = None
    timer_step, timer_t = None, None
    for index in range(start, num_steps):
        local = data.train_batch(stream, step=index, batch_size=batch, seq_len=length,
                                 seed=config.seed, process_index=row_index,
                                 process_count=row_count, packed=config.dataset.packed)
        state, metrics = train_step(state, sharding.global_batch(mesh, local,
                                                                 global_batch_size=batch))
        done = index + 1
        if pending is not None:  # the previous step's loss: one step in flight, no stall
            _finite_or_raise(*pending, ckpt)
        pending = (done, metrics)
        logger.advance()
        if timer_t is None:  # measure throughput from the end of the first (compiling) step
            jax.block_until_ready(metrics)
            timer_step, timer_t = done, time.perf_counter()
        last = done == num_steps
        log = done % config.log_every_steps == 0 or last
        save = done % config.checkpoint_every_steps == 0 or last
        run_eval = eval_stream is not None and ((eval_every and done % eval_every == 0) or last)
        stop = preemption.reached(done)
        if not (log or save or run_eval or stop):
            continue
        host = _finite_or_raise(*pending, ckpt)
        pending = None
        record = {"step": done, "loss": host["loss"], "learning_rate": host["learning_rate"],
                  "grad_norm": host["grad_norm"]}
        if "moe_aux_loss" in host:  # models with MoE layers (train.step)
            record["moe_aux_loss"] = host["moe_aux_loss"]
        now = time.perf_counter()
        if done > timer_step:
            record["tokens_per_sec"] = (done - timer_step) * batch * length / (now - timer_t)
        if run_eval:
            record.update(_eval_all(config, setup, state, stream=eval_stream,
                                    runtime=runtime, extension=extension))
        if log or run_eval:
            logger.write(record)
            result = {**record, "preempted": False}
        if save or stop:
            logger.flush()  # TensorBoard events up to this checkpoint on disk first
            ckpt.save(done, state, {**meta, "data_position": done})
        timer_step, timer_t = done, time.perf_counter()  # eval and saving are not training
        if stop and not last:
            return state, {**result, "step": done, "preempted": True}
    if pending is not None:
        _finite_or_raise(*pending, ckpt)
    return state, {**result, "step": int(jax.device_get(state["step"]))}
