"""The extension study's runners and its record for the engine (`train.engine`).

    run(config, workdir, *, load, inspect=settings.checkpoint_facts, progress=True)
        -> {job name: result row}

`load` is `posenc_jax.pretrained.load` (`__main__` passes it; tests pass a tiny one):
`load(path, dtype=, rope_scaling=)` -> an object with `.model`, `.tokenizer`. The config is
read once (`settings.read`: every key checked, each checkpoint's C and rotary dim from its
header by `inspect`) before the engine takes the workdir. The engine (`train.engine.run`) skips
every job whose stored result (<workdir>/results/<job name>.json) has its fingerprint, prints
the estimate (`estimate_all`: calibrated on the first model, `estimate`), runs the rest in
plan order with one progress bar, and stops after the job in progress at SIGTERM or Ctrl-C
(exit 0; the same command continues). At the end `report.write_all` writes report.md, the
CSVs and the figures.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import numpy as np
from flax import nnx

from train.engine import record
from train.engine import run as engine
from train.extend import estimate, measure, prompts, report, texts
from train.extend import settings as settings_lib
from train.extend.plan import PasskeyJob, Plan, PplJob, plan_of


def with_attention(model, attention: str, block_size: int, scan_layers: bool = False):
    """`model` with another attention implementation and / or its blocks scanned (same
    params: a scanned model stacks the layers' params at trace time); unchanged for ('', 0,
    False)."""
    cfg = model.config
    if ((not attention or (attention == cfg.attention and block_size in (0, cfg.block_size)))
            and scan_layers == cfg.scan_layers):
        return model
    cfg = dataclasses.replace(cfg, attention=attention or cfg.attention,
                              block_size=block_size or cfg.block_size,
                              scan_layers=scan_layers or cfg.scan_layers)
    abstract = nnx.eval_shape(lambda: type(model)(cfg, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    return nnx.merge(graphdef, nnx.state(model))


@dataclasses.dataclass
class Context:
    """What the jobs share: the plan, `load`, the model loaded last and the token ids."""

    plan: Plan
    load: Any
    key: tuple | None = None
    loaded: Any = None
    model: Any = None
    ids: dict = dataclasses.field(default_factory=dict)
    load_seconds: float = 0.0

    def get(self, name: str, scaling: dict | None):
        """(loaded, model) of `name` with `scaling`, loading only when it changed."""
        key = (name, repr(scaling))
        if key != self.key:
            self.loaded = self.model = None
            start = time.perf_counter()
            s = self.plan.settings
            self.loaded = self.load(s.model(name).path, dtype=s.dtype, rope_scaling=scaling)
            self.model = with_attention(self.loaded.model, s.attention, s.block_size,
                                        s.scan_layers)
            self.load_seconds = time.perf_counter() - start
            self.key = key
        return self.loaded, self.model

    def text_ids(self, name: str, text: str, n: int) -> list[int]:
        have = self.ids.get((name, text))
        if have is None or len(have) < n:
            have = texts.document_ids(self.loaded.tokenizer, text, n,
                                      add_bos=self.plan.settings.model(name).add_bos)
            self.ids[(name, text)] = have
        return have[:n]


def run_ppl(ctx: Context, job: PplJob) -> dict:
    _, model = ctx.get(job.model, job.rope_scaling)
    start = time.perf_counter()
    nll = measure.position_nll(model, ctx.text_ids(job.model, job.text, job.length + 1))
    return {**job.row(), "tokens": int(nll.size), "loss": float(nll.mean()),
            "ppl": measure.perplexity(nll),
            "buckets": [list(b) for b in measure.bucket_perplexity(nll, context=job.context)],
            "prefix_ppl": {str(m): measure.perplexity(nll[:m]) for m in job.prefixes},
            "seconds": time.perf_counter() - start}


def passkey_prompts(tokenizer, job: PasskeyJob, *, add_bos: bool) -> list[prompts.Prompt]:
    """The job's prompts: every depth with every key, `length - max_new_tokens` tokens each
    (so prompt and answer fit in `length` positions)."""
    bos = getattr(tokenizer, "bos_id", None)
    prefix = [int(bos)] if add_bos and bos is not None else []
    encode = functools.partial(texts.plain_ids, tokenizer)
    return [prompts.passkey_prompt(encode, length=job.length - job.max_new_tokens,
                                   depth=d, key=k, prefix=prefix)
            for d in job.depths for k in job.keys]


def run_passkey(ctx: Context, job: PasskeyJob) -> dict:
    loaded, model = ctx.get(job.model, job.rope_scaling)
    start = time.perf_counter()
    items = passkey_prompts(loaded.tokenizer, job,
                            add_bos=ctx.plan.settings.model(job.model).add_bos)
    answers = measure.passkey_answers(model, [p.ids for p in items],
                                      decode=loaded.tokenizer.decode,
                                      max_new_tokens=job.max_new_tokens)
    hits = [prompts.answer_matches(a, p.key) for a, p in zip(answers, items)]
    return {**job.row(), "trials": len(items), "correct": int(sum(hits)),
            "accuracy": float(np.mean(hits)),
            "answers": [{"depth": p.depth, "key": p.key, "answer": a, "hit": h}
                        for p, a, h in zip(items, answers, hits)],
            "seconds": time.perf_counter() - start}


RUNNERS = {PplJob.kind: run_ppl, PasskeyJob.kind: run_passkey}


def calibrate(ctx: Context, name: str) -> estimate.Cost:
    """Loads `name` (no scaling), times
    one forward of config.calibrate_len tokens (compile timed apart) and, unless
    config.calibrate_attention_len is 0, one layer's attention over that many tokens alone
    (attention's own rate: at long lengths it is most of the FLOPs)."""
    _loaded, model = ctx.get(name, None)
    s = ctx.plan.settings
    n = s.calibrate_len
    ids = ctx.text_ids(name, "prose", n + 1)
    start = time.perf_counter()
    measure.position_nll(model, ids)
    first = time.perf_counter() - start
    start = time.perf_counter()
    measure.position_nll(model, ids)
    forward = time.perf_counter() - start
    n_attn = s.calibrate_attention_len
    attn = measure.attention_seconds(model, n_attn) if n_attn else None
    return estimate.Cost.calibrate(model.config, forward_seconds=forward, length=n,
                                   compile_s=max(0.0, first - forward),
                                   load_s=ctx.load_seconds, attention_seconds=attn,
                                   attention_length=n_attn)


def estimate_all(ctx: Context, todo, workers: int) -> record.Estimate:
    """Calibrates on the first model of `todo` (`calibrate`) and prices every job."""
    del workers  # one process: the models are large and the loads dominate
    start = time.perf_counter()
    cost = calibrate(ctx, todo[0].model)
    took = time.perf_counter() - start
    seconds = estimate.job_seconds(cost, todo)
    total = sum(seconds.values())
    return record.Estimate(
        seconds=seconds,
        line=report.summary(ctx.plan, todo, total=total, cost=cost, calibrated_s=took),
        record={"calibrate_s": took, "flops_per_s": cost.flops_per_s,
                "attention_flops_per_s": cost.attention_flops_per_s,
                "compile_s": cost.compile_s, "load_s": cost.load_s})


def prepare(plan: Plan, *, load) -> Context:
    return Context(plan=plan, load=load)


def study() -> record.Study:
    """The extension study's record (its runners read from `RUNNERS` now)."""
    return record.Study(name="extend", plan=plan_of, runners=dict(RUNNERS),
                        report=report.write_all, prepare=prepare, estimate=estimate_all,
                        describe=report.describe, results_dir="results")


def run(config, workdir: str, *, load, inspect=settings_lib.checkpoint_facts,
        progress: bool = True) -> dict[str, dict]:
    """Runs (or resumes) the study; returns {job name: row}. ValueError / TypeError before
    any job for a bad config or a missing model file; WorkdirBusyError while another run
    holds the workdir."""
    settings = settings_lib.read(config, inspect=inspect)
    results = engine.run(study(), settings, workdir, progress=progress, load=load)
    return {job.name: row for job, row in results.items()}
