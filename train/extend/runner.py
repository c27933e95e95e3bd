"""The extension study's runner: runs a plan's jobs, resuming from what the workdir holds.

    run(config, workdir, *, load, progress=True) -> {job name: result row}

`load` is `posenc_jax.pretrained.load` (`__main__` passes it; tests pass a tiny one):
`load(path, dtype=, rope_scaling=)` -> an object with `.model`, `.tokenizer`. The runner
takes <workdir>/.lock (`train.workdir_lock`), skips every job whose stored result
(<workdir>/results/<job name>.json) has its fingerprint, calibrates the estimate on the first
model (`estimate`), prints it, then runs the rest in plan order with one progress bar, saving
each result as it finishes. SIGTERM (or Ctrl-C) stops after the job in progress: its result
is saved when it finished, the process exits 0 and the same command continues. At the end
`report.write_all` writes report.md, the CSVs and the figures.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time
from typing import Any

import jax
import numpy as np
import tqdm
from flax import nnx

from train.extend import estimate, measure, prompts, report, texts
from train.extend.plan import Job, PasskeyJob, Plan, PplJob, make_plan
from train.study import files
from train.study.runner import advance
from train.workdir_lock import WorkdirLock

RESULTS = "results"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def result_path(plan: Plan, job: Job) -> str:
    return os.path.join(plan.workdir, RESULTS, f"{job.name}.json")


def stored(plan: Plan) -> dict[Job, dict]:
    """The stored result of every job that has one with its fingerprint."""
    out = {}
    for job in plan.jobs:
        row = files.read_json(result_path(plan, job))
        if row and row.get("fingerprint") == job.fingerprint:
            out[job] = row
    return out


def model_path(config, name: str) -> str:
    """config.model.<name>.file, under config.pretrained_dir, else $POSENC_PRETRAINED_DIR,
    else <repo>/.pretrained (unless absolute)."""
    file = config.model[name].file
    root = (config.get("pretrained_dir") or os.environ.get("POSENC_PRETRAINED_DIR")
            or os.path.join(ROOT, ".pretrained"))
    path = file if os.path.isabs(file) else os.path.join(root, file)
    if not os.path.exists(path):
        raise ValueError(f"model {name!r}: {path} does not exist (bash scripts/"
                         "fetch_pretrained.sh DIR, then --config.pretrained_dir=DIR or "
                         "POSENC_PRETRAINED_DIR=DIR)")
    return path


def with_attention(model, attention: str, block_size: int):
    """`model` with another attention implementation (same params); unchanged for ''."""
    if not attention or (attention == model.config.attention
                         and block_size in (0, model.config.block_size)):
        return model
    cfg = dataclasses.replace(model.config, attention=attention,
                              block_size=block_size or model.config.block_size)
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
            cfg = self.plan.config
            self.loaded = self.load(model_path(cfg, name), dtype=cfg.dtype, rope_scaling=scaling)
            self.model = with_attention(self.loaded.model, cfg.attention, int(cfg.block_size))
            self.load_seconds = time.perf_counter() - start
            self.key = key
        return self.loaded, self.model

    def text_ids(self, name: str, text: str, n: int) -> list[int]:
        have = self.ids.get((name, text))
        if have is None or len(have) < n:
            have = texts.document_ids(self.loaded.tokenizer, text, n,
                                      add_bos=bool(self.plan.config.model[name].add_bos))
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
                            add_bos=bool(ctx.plan.config.model[job.model].add_bos))
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
    cfg = ctx.plan.config
    n = int(cfg.calibrate_len)
    ids = ctx.text_ids(name, "prose", n + 1)
    start = time.perf_counter()
    measure.position_nll(model, ids)
    first = time.perf_counter() - start
    start = time.perf_counter()
    measure.position_nll(model, ids)
    forward = time.perf_counter() - start
    n_attn = int(cfg.get("calibrate_attention_len", 0) or 0)
    attn = measure.attention_seconds(model, n_attn) if n_attn else None
    return estimate.Cost.calibrate(model.config, forward_seconds=forward, length=n,
                                   compile_s=max(0.0, first - forward),
                                   load_s=ctx.load_seconds, attention_seconds=attn,
                                   attention_length=n_attn)


class _Stop:
    """SIGTERM / SIGINT set a flag; the loop stops after the job in progress."""

    def __init__(self):
        self.asked = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._ask)
        return self

    def _ask(self, signum, frame):
        self.asked = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def run(config, workdir: str, *, load, progress: bool = True) -> dict[str, dict]:
    """Runs (or resumes) the study; returns {job name: row}. ValueError before any job for
    a bad config or a missing model file; WorkdirBusyError while another run holds it."""
    plan = make_plan(config, workdir)
    for name in plan.models:
        model_path(config, name)
    with WorkdirLock(plan.workdir):
        return _run(plan, load, progress)


def _run(plan: Plan, load, progress: bool) -> dict[str, dict]:
    wall = time.perf_counter()
    os.makedirs(os.path.join(plan.workdir, RESULTS), exist_ok=True)
    results = stored(plan)
    todo = [job for job in plan.jobs if job not in results]
    ctx = Context(plan=plan, load=load)
    invocation = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "jobs": len(todo),
                  "load_at_start": list(os.getloadavg())}
    if todo:
        start = time.perf_counter()
        cost = calibrate(ctx, todo[0].model)
        invocation["calibrate_s"] = time.perf_counter() - start
        seconds = {job: cost.seconds(job) for job in todo}
        total = estimate.total_seconds(cost, todo)
        invocation.update(estimate_s=total, flops_per_s=cost.flops_per_s,
                          attention_flops_per_s=cost.attention_flops_per_s,
                          compile_s=cost.compile_s, load_s=cost.load_s)
        print(report.summary(plan, todo, total=total, cost=cost,
                             calibrated_s=invocation["calibrate_s"]), flush=True)
        bar = tqdm.tqdm(total=total, unit="s(est)", disable=not progress, dynamic_ncols=True,
                        bar_format="extend {percentage:3.0f}%|{bar}| {postfix} "
                                   "[{elapsed}<{remaining}]")
        try:
            with _Stop() as stop:
                for i, job in enumerate(todo, 1):
                    row = RUNNERS[job.kind](ctx, job)
                    files.write_json(result_path(plan, job), row)
                    results[job] = row
                    bar.set_postfix_str(f"{i}/{len(todo)}, last: {report.describe(row)}",
                                        refresh=False)
                    advance(bar, seconds[job])
                    if stop.asked and i < len(todo):
                        bar.close()
                        print(f"extend: stopped after {i} of {len(todo)} jobs (results "
                              f"saved in {plan.workdir}); rerun the same command to "
                              "continue", flush=True)
                        raise SystemExit(0)
        finally:
            bar.close()
    invocation["wall_s"] = time.perf_counter() - wall
    report.write_all(plan, results, invocation=invocation,
                     devices=f"{jax.devices()[0].platform} x{len(jax.devices())}")
    print(f"extend: wrote {report.paths(plan.workdir)} ({invocation['wall_s']:.0f} s this "
          "run)", flush=True)
    return {job.name: row for job, row in results.items()}
