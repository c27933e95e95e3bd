"""How one study job runs, resuming from what the workdir holds (`runner` orders them).

    prepare(plan, runtime=None) -> Context   checks, before the first job, what the pure plan
                                             cannot (below)
    RUNNERS[job.kind](ctx, job)              runs it; returns its result (the engine stores
                                             an evaluation's row)
    STORED[job.kind](ctx, job)               a training's result (its marker), or None

`prepare` checks that existing trainings in the workdir were made with the same config, that
every eval length fits the memory budget on this mesh, and that the eval split is longer than
`eval_num_tokens`. A job runs unless its stored result has the job's fingerprint:

  train  `train.trainer.train_and_evaluate` in workdir/<model>/, so an interrupted training
         resumes from its checkpoint; done when the marker file (`files.MARKER`) has the
         fingerprint and the checkpoint is at the final step (`STORED`).
  longrope_search   the searched method's search (`train.study.searched`), resumable per
         generation; its result is stored like an evaluation's row. A fine-tune of the
         searched method trains with the factors of its own search (the job before it).
  eval   the first `eval_num_tokens` targets of `eval_split` in non-overlapping windows of
         `eval_len` (`data.eval_batches`: the same tokens for every length and encoding, each
         window starting without context), on the trained params rebuilt with the job's
         overrides (a scaled encoding keeps the param tree: rope has no params). A job with
         a `note` (the encoding cannot encode those positions) is a row of NaN, not dropped.
         The engine stores its row as workdir/evals/<job name>.json.

Every result lives in the workdir, one directory or file per job, so jobs of different models
can run in different processes (`train.engine.workers`). A new kind of job needs a `RUNNERS`
entry here (and a `STORED` one if the engine's store does not keep its result).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from posenc_jax.model import backends
from posenc_jax.model.config import thaw
from train import checkpoint, data, evaluation, finetune, passkey_eval, sharding, trainer
from train.datasets import passkey
from train.engine.store import read_json, write_json
from train.runtime import Runtime
from train.study import extension, files, searched
from train.study.jobs import EvalJob, FinetuneJob, PasskeyJob, TrainJob, config_diff, train_identity
from train.study.plan import Plan, eval_attention


@dataclasses.dataclass
class Context:
    """What the jobs of one study invocation share (made by `prepare`)."""

    plan: Plan
    runtime: Runtime
    workdir: files.Workdir
    mesh: Any
    batch_shards: int
    eval_stream: data.TokenStream
    corpus: dict
    params: dict = dataclasses.field(default_factory=dict)  # the model being evaluated only


def eval_rows(batch_tokens: int, eval_len: int, shards: int) -> int:
    """Windows per eval batch: batch_tokens // eval_len, at least 1, rounded up to a multiple
    of the batch-sharding size."""
    rows = max(1, batch_tokens // eval_len)
    return -(-rows // shards) * shards


def eval_bytes(mc, *, batch: int, length: int, attention: str, block: int) -> float:
    """Rough peak bytes of one eval forward pass (float32 activations)."""
    materialised = attention != backends.AUTO and backends.get(attention).materialises_scores
    keys = length if materialised else min(block, length)
    scores = 3.0 * batch * mc.num_heads * length * keys * 4
    acts = 4.0 * batch * length * (max(mc.mlp_dim, mc.embed_dim) * 2 + mc.vocab_size * 2)
    return scores + acts


def _check_workdir(workdir: files.Workdir, job: TrainJob, config) -> None:
    """ValueError unless the model's directory is empty or holds this job's training; the
    message names the train config keys that changed (the marker's `config`), as the trainer
    does, where the marker has them."""
    marker_path, model_dir = workdir.marker(job.model), workdir.model_dir(job.model)
    if os.path.exists(marker_path):
        marker = read_json(marker_path) or {}
        if marker.get("fingerprint") != job.fingerprint:
            saved = marker.get("config")
            diff = config_diff(saved, train_identity(config)) if isinstance(saved, dict) else []
            if diff:
                what = "; ".join(diff)
            elif isinstance(job, FinetuneJob):
                what = f"the same config but another training of its base model {job.base!r}"
            else:  # a marker written before markers stored the config
                what = f"fingerprint {marker.get('fingerprint')} there, {job.fingerprint} here"
            raise ValueError(
                f"{model_dir} holds a training of {job.model!r} made with a different train "
                f"config ({what}); nothing was changed. Rerun with the original config, use "
                "another --workdir or remove that directory")
    elif os.path.isdir(os.path.join(model_dir, checkpoint.CHECKPOINT_DIR)):
        raise ValueError(f"{model_dir} holds checkpoints that this study did not write (no "
                         f"{files.MARKER}); use another --workdir or remove that directory")


def _check_memory(plan: Plan, shards: int) -> None:
    config, limit = plan.config, float(plan.config.max_eval_memory_gb) * 2**30
    for mc in plan.model_configs.values():
        attention = eval_attention(config, mc)
        block = int(config.get("eval_block_size") or mc.block_size)
        for n in plan.eval_lens:
            rows = eval_rows(int(config.eval_batch_tokens), n, shards)
            need = eval_bytes(mc, batch=rows, length=n, attention=attention, block=block)
            if need > limit:
                fixes = ("lower eval_batch_tokens or eval_block_size, or drop the length"
                         if attention == backends.BLOCKWISE else  # never what it already is
                         f"use eval_attention={backends.BLOCKWISE!r}, lower eval_batch_tokens, "
                         "or drop the length")
                raise ValueError(
                    f"eval length {n} with {attention} attention needs about {need / 2**30:.1f} "
                    f"GiB (batch {rows}) > config.max_eval_memory_gb={config.max_eval_memory_gb};"
                    f" {fixes}")


def prepare(plan: Plan, runtime: Runtime | None = None) -> Context:
    """Checks what needs the workdir, devices or data (see the module docstring)."""
    runtime = runtime or Runtime()
    workdir = files.Workdir(plan.workdir)
    for job in plan.of_kind(TrainJob.kind) + plan.of_kind(FinetuneJob.kind):
        _check_workdir(workdir, job, plan.train_configs[job.model])
    first = plan.train_configs[plan.models[0]]
    mesh = sharding.make_mesh(first.mesh)
    shards = int(mesh.shape["data"] * mesh.shape["fsdp"])
    _check_memory(plan, shards)
    stream = runtime.stream(first.dataset, plan.config.eval_split)
    if plan.eval_num_tokens >= len(stream):
        raise ValueError(f"config.eval_num_tokens={plan.eval_num_tokens} must be < the "
                         f"{len(stream)} tokens of the {plan.config.eval_split!r} split")
    ds = first.dataset
    corpus = data.corpus_identity(ds.data_dir, name=ds.name, **ds.kwargs.to_dict())
    corpus["eval_split_tokens"] = len(stream)
    searches = plan.of_kind(searched.SearchJob.kind)
    if searches:
        s = searched.settings(plan.config)
        have = len(runtime.stream(first.dataset, s.split))
        need = max(max(1, s.tokens // j.target_len) * j.target_len for j in searches)
        if have < need:
            raise ValueError(f"config.longrope_search.split={s.split!r} has {have} tokens; the "
                             f"searches need {need} (config.longrope_search.tokens={s.tokens})")
    return Context(plan=plan, runtime=runtime, workdir=workdir, mesh=mesh, batch_shards=shards,
                   eval_stream=stream, corpus=corpus)


def train_done(ctx: Context, job: TrainJob) -> dict | None:
    """The marker of a finished training of this job's config, else None."""
    marker = read_json(ctx.workdir.marker(job.model))
    if not marker or marker.get("fingerprint") != job.fingerprint:
        return None
    directory = os.path.join(ctx.workdir.model_dir(job.model), checkpoint.CHECKPOINT_DIR)
    if not os.path.isdir(directory):
        return None
    ckpt = checkpoint.Checkpointer(directory, async_save=False, read_only=True)
    try:
        final = ctx.plan.train_configs[job.model].num_train_steps
        return marker if ckpt.latest_step() == final else None
    finally:
        ckpt.close()


def run_train(ctx: Context, job: TrainJob) -> dict:
    """Trains (or resumes) the job's model; returns its marker. SIGTERM: exits 0. A
    `FinetuneJob` first takes its base model's checkpoint as its own first one."""
    model_dir, marker_path = ctx.workdir.model_dir(job.model), ctx.workdir.marker(job.model)
    os.makedirs(model_dir, exist_ok=True)
    marker = read_json(marker_path) or {"train_seconds": 0.0}
    config = ctx.plan.train_configs[job.model]
    write_json(marker_path, {**marker, "fingerprint": job.fingerprint, "finished": False,
                             "config": train_identity(config)})
    start = time.perf_counter()
    if isinstance(job, FinetuneJob) and job.search:  # the searched method: its factors
        config = searched.tuned_config(ctx.workdir, config, tuple(job.search),
                                       train_len=ctx.plan.train_len)
    if isinstance(job, FinetuneJob):
        finetune.start_from(ctx.workdir.model_dir(job.base), model_dir, config, step=job.step)
    result = trainer.train_and_evaluate(config, model_dir, runtime=ctx.runtime,
                                        progress=False)  # one bar: the study's
    seconds = time.perf_counter() - start
    if result.get("preempted"):  # SIGTERM: the trainer saved a checkpoint; exit 0 like it
        print(f"study: training {job.model!r} was preempted at step {result['step']} "
              "(checkpoint saved); rerun the same command to resume", flush=True)
        raise SystemExit(0)
    marker = {**marker, "fingerprint": job.fingerprint, "finished": True,
              "config": train_identity(ctx.plan.train_configs[job.model]),
              "train_seconds": marker.get("train_seconds", 0.0) + seconds,
              "final_loss": result.get("loss"), "step": result.get("step")}
    write_json(marker_path, marker)
    return marker


def _params(ctx: Context, model: str):
    """The trained params of `model`, restored once (the previous model's are dropped)."""
    if model not in ctx.params:
        ctx.params.clear()
        config = ctx.plan.train_configs[model]
        _, params, _ = evaluation.load_params(
            ctx.workdir.model_dir(model), step=config.num_train_steps, mesh=ctx.mesh,
            config=config, runtime=ctx.runtime)
        ctx.params[model] = params
    return ctx.params[model]


def run_eval(ctx: Context, job: EvalJob) -> dict:
    """Evaluates the job; returns its row."""
    row = job.row()
    if job.note:
        row.update(loss=float("nan"), ppl=float("nan"), tokens=0, eval_seconds=0.0,
                   note=job.note)
    else:
        start = time.perf_counter()
        config = ctx.plan.train_configs[job.model]
        overrides = dict(thaw(job.overrides) or {})
        if job.search:  # the searched method: the factors its search found (at the eval
            overrides["encoding_kwargs"] = searched.encoding_kwargs(  # length, or at the
                ctx.workdir, dict(config.model.encoding_kwargs.to_dict()),  # fine-tune's)
                tuple(job.search), train_len=job.train_len,
                target_len=job.finetune_len or job.eval_len)
        setup = ctx.runtime.setup(config, ctx.mesh, model_overrides=overrides)
        result = evaluation.evaluate_params(
            setup.graphdef, _params(ctx, job.model), ctx.eval_stream, seq_len=job.eval_len,
            num_tokens=ctx.plan.eval_num_tokens, mesh=ctx.mesh, rules=setup.rules,
            batch_size=eval_rows(int(ctx.plan.config.eval_batch_tokens), job.eval_len,
                                 ctx.batch_shards),
            packed=config.dataset.packed, runtime=ctx.runtime)
        row.update(loss=result["loss"], ppl=result["ppl"], tokens=result["tokens"],
                   eval_seconds=time.perf_counter() - start, note="")
    return row


def run_passkey(ctx: Context, job: PasskeyJob) -> dict:
    """Passkey retrieval of the job's model at its length; returns its row."""
    row = job.row()
    if job.note:
        row.update(accuracy=float("nan"), correct=0, digit_accuracy=float("nan"),
                   eval_seconds=0.0, note=job.note)
    else:
        start = time.perf_counter()
        config = ctx.plan.train_configs[job.model]
        setup = ctx.runtime.setup(config, ctx.mesh, model_overrides=thaw(job.overrides) or {})
        evalset = passkey.eval_set(job.eval_len, trials=job.trials, seed=job.eval_seed,
                                   digits=extension.PASSKEY_DIGITS)
        result = passkey_eval.passkey_accuracy(
            setup.graphdef, _params(ctx, job.model), evalset, mesh=ctx.mesh, rules=setup.rules,
            batch_size=job.trials)
        row.update(accuracy=result["accuracy"], correct=result["correct"],
                   digit_accuracy=result["digit_accuracy"],
                   eval_seconds=time.perf_counter() - start, note="")
    return row


def run_search(ctx: Context, job: searched.SearchJob) -> dict:
    """The LongRoPE search of the job's model at its target length (`train.study.searched`)."""
    return searched.run_search(ctx, job, params=_params(ctx, job.searched_model))


RUNNERS = {TrainJob.kind: run_train, FinetuneJob.kind: run_train, EvalJob.kind: run_eval,
           PasskeyJob.kind: run_passkey, searched.SearchJob.kind: run_search}
STORED = {TrainJob.kind: train_done, FinetuneJob.kind: train_done}
