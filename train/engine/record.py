"""The study record: what a study is, for the engine (`run.run`).

A study is three pure parts, as optax's `GradientTransformation` is two functions:

    plan(config, workdir) -> plan      the config read once into a typed, frozen plan; `jobs`
                                       lists what to do (each a frozen dataclass with `kind`,
                                       `name`, `model`, `fingerprint`); raises TypeError /
                                       ValueError naming the key before anything runs
    runners[job.kind](ctx, job) -> result       one job, a JSON-able dict
    report(ctx, results, timings) -> [paths]    every file made from the results

Optional capabilities, each for the study that needs it (the engine's default otherwise):

    prepare(plan, **context) -> ctx    checks that need files, devices or data, still before
                                       the first job; what the runners share (default: plan)
    stored[kind](ctx, job)             a kind whose result is not a store file (a training's
                                       checkpoint): its result, or None when not done
    estimate(ctx, todo, workers)       `Estimate`: seconds per job and the line to print
    describe(job, result) -> str       a few words for the progress bar (default: the name)
    partial(ctx, results)              files worth rewriting as each model finishes (a CSV)
    workers(plan) -> int               worker processes asked for (default 1: this process);
                                       > 1 runs each model's jobs in a worker (`workers`)
    results_dir                        the store's folder in the workdir ("results")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A run's time estimate: seconds per job (the bar advances by them), the line printed
    before the first job, and what timings.json keeps of it."""

    seconds: Mapping[Any, float]
    line: str
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def total(self) -> float:
        return float(sum(self.seconds.values()))


@dataclasses.dataclass(frozen=True)
class Study:
    """A study for `train.engine.run.run` (see the module docstring). Give module-level
    functions: a study run in worker processes is sent to them by pickling."""

    name: str
    plan: Callable[..., Any]
    runners: Mapping[str, Callable[[Any, Any], dict]]
    report: Callable[[Any, Mapping[Any, dict], list], list]
    prepare: Callable[..., Any] | None = None
    stored: Mapping[str, Callable[[Any, Any], Any]] = dataclasses.field(default_factory=dict)
    estimate: Callable[[Any, list, int], Estimate] | None = None
    describe: Callable[[Any, Any], str] | None = None
    partial: Callable[[Any, Mapping[Any, dict]], None] | None = None
    workers: Callable[[Any], int] | None = None
    results_dir: str = "results"
