"""The study's runner: runs a plan's jobs, resuming from what the workdir holds.

    run(config, workdir, *, progress=True, runtime=None) -> the result rows (results.csv's)

`make_plan` checks the config and `execute.prepare` the workdir, memory and data before any
job; <workdir>/.lock (`train.workdir_lock`) keeps a second study out of the workdir while
this one runs. Jobs whose stored result has their fingerprint are skipped (`execute.DONE`);
the rest run in plan order in this process, or, with `config.workers` > 1 (0: one per core
on a CPU), model by model in worker processes (`parallel`). One progress bar either way; results.csv
is rewritten as each model finishes, and at the end `report.write_all` writes results.csv,
passkey.csv, report.md and the figures.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import tqdm

from train.runtime import Runtime
from train.study import execute, parallel, report
from train.study.jobs import EvalJob, Job, PasskeyJob
from train.study.plan import make_plan
from train.workdir_lock import WorkdirLock


def _rows(results: dict) -> tuple[list[dict], list[dict]]:
    """(perplexity rows, passkey rows) of the finished evaluations, in plan order."""
    return ([r for j, r in results.items() if j.kind == EvalJob.kind],
            [r for j, r in results.items() if j.kind == PasskeyJob.kind])


def _stored(ctx: execute.Context, jobs) -> dict[Job, Any]:
    """The stored result of each of `jobs` that has one."""
    found = {job: execute.DONE[job.kind](ctx, job) for job in jobs}
    return {job: result for job, result in found.items() if result is not None}


def _bar(total: float, progress: bool):
    return tqdm.tqdm(total=total, unit="s(est)", disable=not progress,
                     dynamic_ncols=True, position=0,
                     bar_format="study {percentage:3.0f}%|{bar}| {postfix} "
                                "[{elapsed}<{remaining}]")


def advance(bar, amount: float) -> None:
    """Moves `bar` on by `amount`, never past its total: the workers finish jobs in another
    order than the plan's, and float sums in another order overshot it ("TqdmWarning:
    clamping frac to range [0, 1]", a remaining time of -00:00)."""
    bar.update(max(0.0, min(amount, bar.total - bar.n)))


def requested_workers(config) -> int:
    """config.workers resolved for this backend and host (0: one per CPU core)."""
    return parallel.resolve_workers(config.get("workers", 1), backend=jax.default_backend(),
                                    cores=len(parallel.cpu_cores()))


def _run_here(ctx, todo, results, on_job, on_model) -> None:
    """The jobs one after the other in this process."""
    for i, job in enumerate(todo, 1):
        results[job] = execute.RUNNERS[job.kind](ctx, job)
        on_job(job, report.describe(job, results[job]))
        if i == len(todo) or todo[i].model != job.model:
            on_model(job.model)


def run(config, workdir: str, *, progress: bool = True, runtime: Runtime | None = None
        ) -> list[dict]:
    """Runs (or resumes) the whole study; returns the result rows. Raises ValueError before
    any job for anything `make_plan` or `execute.prepare` rejects, and WorkdirBusyError while
    another study runs in `workdir` (two would run the same evaluations side by side)."""
    wall_start = time.perf_counter()
    plan = make_plan(config, workdir)
    requested = requested_workers(config)
    with WorkdirLock(plan.workdir):
        return _run(plan, requested, progress=progress, runtime=runtime, wall_start=wall_start)


def _run(plan, requested: int, *, progress: bool, runtime: Runtime | None,
         wall_start: float) -> list[dict]:
    ctx = execute.prepare(plan, runtime or Runtime())
    os.makedirs(ctx.workdir.evals, exist_ok=True)
    results = _stored(ctx, plan.jobs)
    todo = [job for job in plan.jobs if job not in results]
    workers = max(1, min(requested, len(parallel.models_to_do(plan, todo))))  # 1 per model
    speedup = parallel.speedup(workers)
    print(report.summary(plan, todo, workers=workers, speedup=speedup), flush=True)
    estimate = sum(plan.estimate(job) for job in todo)
    this = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "work_items": len(todo),
            "estimate_s": estimate / speedup, "load_at_start": list(os.getloadavg()),
            "workers": workers}
    bar, done = _bar(estimate, progress), []

    def on_job(job: Job, text: str) -> None:
        done.append(job)
        bar.set_postfix_str(f"{len(done)}/{len(todo)} items, last: {text}", refresh=False)
        advance(bar, plan.estimate(job))

    def on_model(_: str) -> None:  # a model finished: save the rows so far (from the files)
        scored = [j for j in plan.jobs if j.kind in (EvalJob.kind, PasskeyJob.kind)]
        report.write_results(ctx.workdir, *_rows(_stored(ctx, scored)))

    try:
        if workers == 1:
            _run_here(ctx, todo, results, on_job, on_model)
        else:
            parallel.run_models(plan, todo, workers=workers, on_job=on_job, on_model=on_model)
            results = _stored(ctx, plan.jobs)
    finally:
        bar.close()
    missing = [job.name for job in plan.jobs if job not in results]
    if missing:
        raise RuntimeError(f"study: jobs {missing[:5]} finished without a stored result")
    rows, passkey_rows = _rows({job: results[job] for job in plan.jobs})
    this["wall_s"] = time.perf_counter() - wall_start
    report.write_all(plan, ctx.workdir, rows=rows, passkey_rows=passkey_rows, results=results,
                     invocation=this, corpus=ctx.corpus)
    print(f"study: wrote {ctx.workdir.results}, {ctx.workdir.report}, {ctx.workdir.plot} "
          f"({this['wall_s']:.0f} s this run)", flush=True)
    return rows
