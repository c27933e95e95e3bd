"""LongRoPE's evolutionary search (Ding et al. 2024, Algorithm 1), for any fitness callable.

    result = search(fitness, Space(pairs=32, scale=8.0), SearchConfig(seed=0),
                    seeds=space_seeds, workdir="runs/lr")
    result.best, result.value          # the lowest-fitness Candidate and its fitness

`fitness(candidate) -> float` (lower is better: the perplexity at the target length for a
pretrained model, `train.longrope.fitness`; anything else for a study or a test). The loop:

    generation 0: the seeds (PI, NTK, YaRN) and mutations of them, `population` in all;
    generation g: parents = the `parents` best so far; children = `mutations` mutations of
                  random parents + `crossovers` crossovers of two (a failed crossover mutates
                  its first parent); population = parents + children.

A candidate is evaluated once (the cache is part of the state). Deterministic for a seed: every
draw comes from one `numpy.random.Generator(PCG64(seed))` whose state is saved with each
generation. With a `workdir`, each generation ends with one atomic JSON file
(`generations/gen_NNNN.json`, `train.longrope.progress`); a rerun on the same workdir resumes
from the last one and reaches the identical result (a longer `generations` continues it).
`log.jsonl` holds one record per generation (best perplexity so far and of the generation,
evaluations, seconds) and `tensorboard/` the same as scalars.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from posenc_jax.checks import finite_float, integer
from train.longrope import progress
from train.longrope.evolve import crossover, mutate
from train.longrope.space import Candidate, Space

__all__ = ["Estimate", "Result", "SearchConfig", "estimate", "search"]


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """The search's hyperparameters; the defaults are the paper's (section 4.1 and the authors'
    `dim_mono.json`): population 64, top-k parents 32, 16 mutations and 16 crossovers per
    generation, per-factor probability 0.3, 40 generations."""

    generations: int = 40
    population: int = 64
    parents: int = 32
    mutations: int = 16
    crossovers: int = 16
    rate: float = 0.3
    crossover_tries: int = 20
    seed: int = 0

    def __post_init__(self):
        for key in ("generations", "crossover_tries", "seed"):
            integer(key, getattr(self, key), minimum=0)
        for key in ("population", "parents"):
            integer(key, getattr(self, key), minimum=1)
        for key in ("mutations", "crossovers"):
            integer(key, getattr(self, key), minimum=0)
        if self.parents > self.population:
            raise ValueError(f"parents={self.parents} must be <= population={self.population}")
        object.__setattr__(self, "rate", finite_float("rate", self.rate, above=0.0,
                                                      maximum=1.0))

    @property
    def evaluations(self) -> int:
        """Evaluations of a whole search at most (fewer when the space repeats itself)."""
        return self.population + self.generations * (self.mutations + self.crossovers)

    def identity(self) -> dict[str, Any]:
        """What a resumed search must share with the one it continues (all but `generations`)."""
        out = dataclasses.asdict(self)
        del out["generations"]
        return out


@dataclasses.dataclass(frozen=True)
class Result:
    """The best candidate, its fitness, one record per generation (as in log.jsonl), and every
    evaluation made (candidate -> fitness)."""

    best: Candidate
    value: float
    records: tuple[dict[str, Any], ...]
    values: Mapping[Candidate, float]


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The cost of a search, from one timed evaluation: seconds per evaluation, evaluations,
    and their product (seconds in all, and per generation after the first)."""

    seconds_per_evaluation: float
    evaluations: int
    seconds: float
    seconds_per_generation: float

    def __str__(self) -> str:
        return (f"estimate: {self.evaluations} evaluations x {self.seconds_per_evaluation:.2f} s"
                f" = {self.seconds:.0f} s ({self.seconds / 3600:.2f} h); "
                f"{self.seconds_per_generation:.0f} s per generation")


def estimate(fitness: Callable[[Candidate], float], candidate: Candidate, config: SearchConfig
             ) -> tuple[Estimate, float]:
    """(the search's cost, `fitness(candidate)`): one evaluation timed and multiplied. Pass
    {candidate: value} to `search(known=...)` so that it is not evaluated twice."""
    t0 = time.perf_counter()
    value = _value(fitness(candidate))
    seconds = time.perf_counter() - t0
    per_generation = seconds * (config.mutations + config.crossovers)
    return Estimate(seconds, config.evaluations, seconds * config.evaluations,
                    per_generation), value


def _value(x: Any) -> float:
    """A fitness value as a float; NaN (a diverged model) ranks last, as +inf."""
    x = float(x)
    return math.inf if math.isnan(x) else x


class _Run:
    """One search's mutable state: the generator, the cache of evaluations, the population."""

    def __init__(self, fitness, space: Space, config: SearchConfig, known):
        self.fitness, self.space, self.config = fitness, space, config
        self.rng = np.random.Generator(np.random.PCG64(config.seed))
        self.values: dict[Candidate, float] = {space.check(c): _value(v)
                                               for c, v in (known or {}).items()}
        self.population: list[Candidate] = []
        self.records: list[dict[str, Any]] = []
        self.generation = -1
        self.seconds = 0.0

    def evaluate(self, candidate: Candidate) -> Candidate:
        self.space.check(candidate)
        if candidate not in self.values:
            self.values[candidate] = _value(self.fitness(candidate))
        return candidate

    def ranked(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Best first; ties keep their order (a stable sort), so the ranking is deterministic."""
        return sorted(candidates, key=lambda c: self.values[c])

    def child(self, parent: Candidate) -> Candidate:
        return mutate(self.rng, parent, self.space, rate=self.config.rate, seen=self.values)

    def first_generation(self, seeds: Sequence[Candidate]) -> None:
        for seed in seeds:
            if seed not in self.population and len(self.population) < self.config.population:
                self.population.append(self.evaluate(seed))
        for i in range(10 * self.config.population):  # bounded: a tiny space may run out
            if len(self.population) >= self.config.population:
                break
            kid = self.evaluate(self.child(self.population[i % len(self.population)]))
            if kid not in self.population:
                self.population.append(kid)

    def next_generation(self) -> None:
        cfg = self.config
        parents = self.ranked(self.population)[:cfg.parents]
        children: list[Candidate] = []
        for _ in range(cfg.mutations):
            children.append(self.evaluate(self.child(parents[self.rng.integers(len(parents))])))
        for _ in range(cfg.crossovers):
            if len(parents) < 2:
                children.append(self.evaluate(self.child(parents[0])))
                continue
            i, j = sorted(self.rng.choice(len(parents), 2, replace=False))
            kid = crossover(self.rng, parents[i], parents[j], self.space, rate=cfg.rate,
                            seen=self.values, tries=cfg.crossover_tries)
            children.append(self.evaluate(kid if kid is not None else self.child(parents[i])))
        self.population = list(dict.fromkeys(parents + children))

    def record(self, seconds: float) -> dict[str, Any]:
        best = self.ranked(list(self.values))[0]
        here = self.ranked(self.population)[0]
        return {"generation": self.generation, "best_ppl": self.values[best],
                "generation_best_ppl": self.values[here], "evaluations": len(self.values),
                "seconds": round(seconds, 3),
                "best": {"long_factor": list(best.factors(self.space.step)),
                         "start": best.start}}


def search(fitness: Callable[[Candidate], float], space: Space, config: SearchConfig, *,
           seeds: Sequence[Candidate] = (), workdir: str | None = None,
           known: Mapping[Candidate, float] | None = None,
           on_generation: Callable[[dict[str, Any]], None] | None = None) -> Result:
    """Runs (or resumes, with a `workdir`) the search; see the module docstring.

    Args:
      fitness: candidate -> float, lower is better (NaN ranks as +inf).
      space: the candidates allowed (`train.longrope.space.Space`).
      config: the hyperparameters.
      seeds: first members of generation 0 (`space.seeds(...)`: PI, NTK, YaRN); with none,
        generation 0 grows from the lowest candidate (every factor 1, the smallest start).
      workdir: where the state, log.jsonl and tensorboard/ go; None keeps nothing.
      known: fitness values already measured (by `estimate`), not evaluated again.
      on_generation: called with each generation's record (progress printing).
    """
    seeds = [space.check(s) for s in seeds] or [Candidate((space.low,) * space.pairs,
                                                          space.starts[0])]
    run = _Run(fitness, space, config, known)
    store = progress.Store(workdir, space=space, config=config) if workdir else None
    try:
        if store is not None:
            store.resume(run)
        while run.generation < config.generations:
            t0 = time.perf_counter()
            if run.generation < 0:
                run.first_generation(seeds)
            else:
                run.next_generation()
            run.generation += 1
            run.seconds += time.perf_counter() - t0
            run.records.append(run.record(time.perf_counter() - t0))
            if store is not None:
                store.save(run)
            if on_generation is not None:
                on_generation(run.records[-1])
    finally:  # an exception (Ctrl-C) still writes the events of the generations done
        if store is not None:
            store.close()
    best = run.ranked(list(run.values))[0]
    return Result(best=best, value=run.values[best], records=tuple(run.records),
                  values=dict(run.values))
