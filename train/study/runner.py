"""The study's record for the engine, and its entry point.

    run(config, workdir, *, progress=True, runtime=None) -> the result rows (results.csv's)

The study is three parts (`STUDY`, a `train.engine.record.Study`): `plan.make_plan` (the
config checked, the jobs listed), the runners of `execute` (train, finetune, eval, passkey),
and `report.write_all` (results.csv, passkey.csv, report.md, the figures). The engine
(`train.engine.run`) does the rest: <workdir>/.lock, `execute.prepare`'s checks before any
job, skipping the jobs whose stored result has their fingerprint (evaluations in
<workdir>/evals/, trainings by their marker and checkpoint), the printed estimate, one
progress bar, SIGTERM / Ctrl-C, timings.json, and with `config.workers` > 1 (0: one per core
on a CPU) the models in worker processes (`train.engine.workers`). results.csv is rewritten as
each model finishes (`report.write_partial`).
"""

from __future__ import annotations

import jax

from train.engine import record, workers
from train.engine import run as engine
from train.runtime import Runtime
from train.study import execute, report
from train.study.jobs import EvalJob
from train.study.plan import make_plan


def requested_workers(plan) -> int:
    """config.workers resolved for this backend and host (0: one per CPU core)."""
    return workers.resolve_workers(plan.config.get("workers", 1),
                                   backend=jax.default_backend(),
                                   cores=len(workers.cpu_cores()))


STUDY = record.Study(
    name="study", plan=make_plan, runners=execute.RUNNERS, report=report.write_all,
    prepare=execute.prepare, stored=execute.STORED, estimate=report.estimate,
    describe=report.describe, partial=report.write_partial, workers=requested_workers,
    results_dir="evals")


def run(config, workdir: str, *, progress: bool = True, runtime: Runtime | None = None
        ) -> list[dict]:
    """Runs (or resumes) the whole study; returns the perplexity rows. Raises ValueError
    before any job for anything `make_plan` or `execute.prepare` rejects, and WorkdirBusyError
    while another run holds `workdir` (two would run the same evaluations side by side)."""
    results = engine.run(STUDY, config, workdir, progress=progress, runtime=runtime)
    return [row for job, row in results.items() if job.kind == EvalJob.kind]
