"""What is done already, and one job run and stored: the two steps every runner shares.

    found(study, ctx, store, jobs) -> {job: result}   the jobs with a result (resume)
    execute(study, ctx, store, job) -> result         runs the job, stores its result
    describe(study, job, result) -> str               a few words for the progress bar

A job's result is its store file (`store.Store`: kept only with the job's fingerprint), except
for the kinds the study keeps itself (`Study.stored`: a training's checkpoint and marker).
"""

from __future__ import annotations

from collections.abc import Iterable

from train.engine.record import Study
from train.engine.store import Store


def found(study: Study, ctx, store: Store, jobs: Iterable) -> dict:
    """{job: result} of the `jobs` that are done."""
    out = {}
    for job in jobs:
        kept = study.stored.get(job.kind)
        result = kept(ctx, job) if kept else store.get(job)
        if result is not None:
            out[job] = result
    return out


def execute(study: Study, ctx, store: Store, job):
    """Runs `job` with its kind's runner; stores and returns the result."""
    result = study.runners[job.kind](ctx, job)
    return result if job.kind in study.stored else store.put(job, result)


def describe(study: Study, job, result) -> str:
    return study.describe(job, result) if study.describe else job.name
