"""LongRoPE's mutation and crossover, each keeping every constraint of the space.

Following the paper's Algorithm 1 (arXiv:2402.13753, section 3.2) and the authors' released
search (its `dim_mono` algorithm):

* mutation: each factor, with probability `rate`, is redrawn uniformly from the grid between
  its neighbours' current values (the first from the lower bound, the last up to the upper
  bound), so the result stays non-decreasing and inside the bounds by construction; the start
  count, with the same probability, is redrawn from the allowed starts. Redrawn until the child
  is new (not in `seen`), at most `tries` rounds.
* crossover: each factor of parent 1, with probability `rate`, is taken from parent 2; a child
  that breaks monotonicity or was seen is discarded and drawn again, at most `tries` times;
  None if no child came (the search then mutates parent 1 instead). The start count comes from
  either parent with probability 1/2.

Every random draw comes from the `numpy.random.Generator` passed in, so a search is a pure
function of its seed and its fitness values.
"""

from __future__ import annotations

import itertools
from collections.abc import Container

import numpy as np

from train.longrope.space import Candidate, Space

__all__ = ["crossover", "mutate"]


def mutate(rng: np.random.Generator, parent: Candidate, space: Space, *, rate: float,
           seen: Container[Candidate], tries: int = 100) -> Candidate:
    """A new candidate near `parent` (module doc). Returns the last draw if every one of
    `tries` rounds was already seen (a space too small to hold a new one)."""
    steps = list(parent.steps)
    start = parent.start
    for _ in range(tries):
        for i in range(space.pairs):
            if rng.random() < rate:
                lo = space.low if i == 0 else steps[i - 1]
                hi = space.high if i == space.pairs - 1 else steps[i + 1]
                steps[i] = int(rng.integers(lo, hi + 1))
        if len(space.starts) > 1 and rng.random() < rate:
            start = int(space.starts[rng.integers(len(space.starts))])
        child = Candidate(tuple(steps), start)
        if child not in seen:
            return child
    return child


def crossover(rng: np.random.Generator, first: Candidate, second: Candidate, space: Space, *,
              rate: float, seen: Container[Candidate], tries: int = 20) -> Candidate | None:
    """A child mixing the two parents' factors (module doc), or None."""
    if first == second:
        return None
    for _ in range(tries):
        take = rng.random(space.pairs) < rate
        steps = tuple(int(b if t else a) for a, b, t in zip(first.steps, second.steps, take))
        start = second.start if rng.random() < 0.5 else first.start
        child = Candidate(steps, start)
        if all(a <= b for a, b in itertools.pairwise(steps)) and child not in seen:
            return child
    return None
