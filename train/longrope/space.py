"""LongRoPE's search space: what a candidate is, its constraints, and the PI / NTK / YaRN seeds.

A candidate (Ding et al. 2024, arXiv:2402.13753, section 3) is one rescale factor per rotary
pair, `long_factor[i]` = lambda_i (pair i rotates at theta_i / lambda_i beyond the original
context), and `start`, the count n-hat of initial positions kept at the original rotation. The
paper's space (its Table 4), for a target scale s = target_length / original_length:

    lambda_i in [1.0, 1.25 s] on a grid of step 0.01;   lambda_i <= lambda_(i+1)
    n-hat in {0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256}

The monotone constraint follows NTK theory: lower frequencies (larger i) are interpolated at
least as much as higher ones. Factors are held as integer grid steps (`steps[i]` * `step`), so
equality, hashing and the JSON state are exact.

Shapes: R rotary pairs (rotary_dim / 2).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from posenc_jax.checks import finite_float, integer
from posenc_jax.encodings import rope_scaling
from posenc_jax.encodings.frequencies import inv_freq_float64

__all__ = ["PAPER_STARTS", "Candidate", "Space", "seeds"]

PAPER_STARTS = (0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the space: `steps` int [R] (factor_i = steps[i] * space.step) and `start`
    (n-hat, positions below it keep the unscaled rotation)."""

    steps: tuple[int, ...]
    start: int = 0

    def factors(self, step: float) -> tuple[float, ...]:
        """long_factor as floats [R] (rounded to the grid's decimals)."""
        digits = max(0, -math.floor(math.log10(step))) + 2
        return tuple(round(k * step, digits) for k in self.steps)

    def to_json(self) -> dict:
        return {"steps": list(self.steps), "start": self.start}

    @classmethod
    def from_json(cls, value: dict) -> Candidate:
        return cls(steps=tuple(int(k) for k in value["steps"]), start=int(value["start"]))


@dataclasses.dataclass(frozen=True)
class Space:
    """The search space for R = `pairs` rotary pairs and target scale `scale` (s > 1).

    Attributes:
      pairs: R, one factor per rotary pair.
      scale: s = target_length / original_max_position_embeddings.
      step: the factors' grid (0.01 in the paper).
      max_ratio: the upper bound is max_ratio * s (1.25 in the paper); the lower bound is 1.
      starts: the allowed start counts n-hat; `(0,)` keeps it at 0 (exportable to transformers).
    """

    pairs: int
    scale: float
    step: float = 0.01
    max_ratio: float = 1.25
    starts: tuple[int, ...] = PAPER_STARTS

    def __post_init__(self):
        integer("pairs", self.pairs, minimum=1)
        object.__setattr__(self, "scale", finite_float("scale", self.scale, above=1.0))
        object.__setattr__(self, "step", finite_float("step", self.step, above=0.0, maximum=1.0))
        object.__setattr__(self, "max_ratio", finite_float("max_ratio", self.max_ratio,
                                                           minimum=1.0))
        starts = tuple(integer("starts[]", n, minimum=0) for n in self.starts)
        if not starts or len(set(starts)) != len(starts):
            raise ValueError(f"starts must be distinct counts >= 0, at least one, got starts="
                             f"{self.starts!r}")
        object.__setattr__(self, "starts", tuple(sorted(starts)))

    @property
    def low(self) -> int:
        """The lower bound in grid steps (factor 1.0)."""
        return math.ceil(1.0 / self.step - 1e-9)

    @property
    def high(self) -> int:
        """The upper bound in grid steps (max_ratio * scale, rounded down to the grid)."""
        return math.floor(self.max_ratio * self.scale / self.step + 1e-9)

    def to_steps(self, factors) -> tuple[int, ...]:
        """Factors [R] -> the nearest grid steps, clipped to the bounds and made monotone
        (a running maximum), i.e. the closest candidate factors that satisfy the constraints."""
        f = np.asarray(factors, np.float64)
        if f.shape != (self.pairs,):
            raise ValueError(f"factors must have R={self.pairs} entries, got shape {f.shape}")
        k = np.clip(np.rint(f / self.step), self.low, self.high).astype(np.int64)
        return tuple(int(v) for v in np.maximum.accumulate(k))

    def check(self, candidate: Candidate) -> Candidate:
        """`candidate` if it lies in the space; ValueError naming the broken constraint."""
        if not isinstance(candidate, Candidate):
            raise TypeError(f"candidate must be a Candidate, got {type(candidate).__name__}")
        k = candidate.steps
        if len(k) != self.pairs:
            raise ValueError(f"candidate has {len(k)} factors; the space has R={self.pairs}")
        if any(not isinstance(v, int) or isinstance(v, bool) for v in k):
            raise TypeError(f"candidate steps must be ints, got {k!r}")
        if min(k) < self.low or max(k) > self.high:
            raise ValueError(f"candidate factors {candidate.factors(self.step)} leave the "
                             f"bounds [{self.low * self.step}, {self.high * self.step}]")
        if any(a > b for a, b in itertools.pairwise(k)):
            raise ValueError(f"candidate factors {candidate.factors(self.step)} are not "
                             "non-decreasing toward low frequencies")
        if candidate.start not in self.starts:
            raise ValueError(f"candidate start={candidate.start!r} is not one of the allowed "
                             f"starts {self.starts}")
        return candidate

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def seeds(space: Space, *, original_max_position_embeddings: int, base: float) -> list[Candidate]:
    """The paper's initial candidates: PI (every factor s), the NTK-aware rule
    (s^(2i / (d - 2)), d = 2R) and YaRN (its per-pair ratio inv_freq / yarn(inv_freq)), each
    snapped to the grid, with start 0. Duplicates (a small R) are dropped, order kept."""
    r, s = space.pairs, space.scale
    theta = inv_freq_float64(2 * r, base=base)
    pi = np.full(r, s)
    ntk = s ** (np.arange(r) / max(r - 1, 1))
    yarn_freq, _ = rope_scaling.yarn(
        theta, factor=s, original_max_position_embeddings=original_max_position_embeddings,
        base=base)
    yarn = theta / np.asarray(yarn_freq, np.float64)
    start = 0 if 0 in space.starts else space.starts[0]
    out: list[Candidate] = []
    for factors in (pi, ntk, yarn):
        cand = Candidate(space.to_steps(factors), start)
        if cand not in out:
            out.append(cand)
    return out
