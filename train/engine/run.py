"""The engine's one loop: a study's plan run (or resumed) in a workdir.

    results = run(study, config, workdir, *, progress=True, **context) -> {job: result}

1. `study.plan(config, workdir)`: the config checked and read into a frozen plan (pure: a bad
   key raises here, before any file is made), and `study.workers(plan)`, the processes asked
   for;
2. <workdir>/.lock (`train.workdir_lock`): a second run of any study in the workdir is refused
   with WorkdirBusyError while this one holds it;
3. `study.prepare(plan, **context)`: what needs files, devices or data, still before any job;
4. the jobs already done are skipped (`resume.found`), the estimate of the rest is printed
   (`study.estimate`), and they run in plan order here, or each model's in a worker process
   (`workers`), with one progress bar; each result is stored as it finishes
   (`resume.execute`), and `study.partial` rewrites what it can as each model ends;
5. SIGTERM or Ctrl-C (`signals.Stop`) stops after the job in progress: the process exits 0
   and the same command continues where it stopped;
6. timings.json gets this invocation's record, and `study.report` writes its files.
"""

from __future__ import annotations

import os
import time

from train.engine import progress as progress_lib
from train.engine import resume, workers
from train.engine.record import Estimate, Study
from train.engine.signals import Stop
from train.engine.store import TIMINGS, Store, append_timing
from train.workdir_lock import WorkdirLock


def run(study: Study, config, workdir: str, *, progress: bool = True, **context) -> dict:
    """Runs (or resumes) `study` in `workdir`; returns {job: result} in plan order. Raises
    TypeError / ValueError before any job for a config its plan or prepare refuses, and
    WorkdirBusyError while another run holds the workdir."""
    wall = time.perf_counter()
    plan = study.plan(config, workdir)
    requested = study.workers(plan) if study.workers else 1
    with WorkdirLock(plan.workdir):
        return _run(study, plan, requested, progress=progress, context=context, wall=wall)


def _default_estimate(study: Study, plan, todo) -> Estimate:
    return Estimate(seconds={job: 0.0 for job in todo},
                    line=f"{study.name}: {len(todo)} of {len(plan.jobs)} jobs to do")


def _run(study: Study, plan, requested: int, *, progress: bool, context: dict,
         wall: float) -> dict:
    ctx = study.prepare(plan, **context) if study.prepare else plan
    store = Store(plan.workdir, study.results_dir)
    os.makedirs(store.folder, exist_ok=True)
    results = resume.found(study, ctx, store, plan.jobs)
    todo = [job for job in plan.jobs if job not in results]
    count = max(1, min(requested, len(workers.models_to_do(plan, todo))))
    invocation = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "jobs": len(todo),
                  "load_at_start": list(os.getloadavg()), "workers": count, "estimate_s": 0.0}
    if todo:
        start = time.perf_counter()
        est = (study.estimate(ctx, todo, count) if study.estimate
               else _default_estimate(study, plan, todo))
        invocation.update({"estimate_s": est.total, "estimate_took_s":
                           time.perf_counter() - start, **est.record})
        print(est.line, flush=True)
        _execute_all(study, ctx, store, plan, todo, results, est, count, progress)
    missing = [job.name for job in plan.jobs if job not in results]
    if missing:
        raise RuntimeError(f"{study.name}: jobs {missing[:5]} finished without a stored result")
    ordered = {job: results[job] for job in plan.jobs}
    invocation["wall_s"] = time.perf_counter() - wall
    timings = append_timing(os.path.join(plan.workdir, TIMINGS), invocation)
    written = study.report(ctx, ordered, timings)
    print(f"{study.name}: wrote {', '.join(written)} ({invocation['wall_s']:.0f} s this run)",
          flush=True)
    return ordered


def _execute_all(study: Study, ctx, store: Store, plan, todo: list, results: dict,
                 est: Estimate, count: int, progress: bool) -> None:
    """The `todo` jobs, here or in `count` worker processes; `results` gets theirs."""
    bar, done = progress_lib.bar(est.total, name=study.name, progress=progress), []

    def on_job(job, text: str) -> None:
        done.append(job)
        bar.set_postfix_str(f"{len(done)}/{len(todo)} jobs, last: {text}", refresh=False)
        progress_lib.advance(bar, est.seconds.get(job, 0.0))

    def on_model(_: str) -> None:
        if study.partial:
            study.partial(ctx, resume.found(study, ctx, store, plan.jobs))

    try:
        with Stop() as stop:
            if count > 1:
                workers.run_models(study, plan, todo, workers=count, seconds=est.seconds,
                                   on_job=on_job, on_model=on_model, stop=stop)
                results.update(resume.found(study, ctx, store, plan.jobs))
                return
            for i, job in enumerate(todo, 1):
                results[job] = resume.execute(study, ctx, store, job)
                on_job(job, resume.describe(study, job, results[job]))
                if i == len(todo) or todo[i].model != job.model:
                    on_model(job.model)
                if stop.asked and i < len(todo):
                    bar.close()
                    print(f"{study.name}: stopped after {i} of {len(todo)} jobs (each result "
                          f"is saved in {plan.workdir}); rerun the same command to resume",
                          flush=True)
                    raise SystemExit(0)
    finally:
        bar.close()
