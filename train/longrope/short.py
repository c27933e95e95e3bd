"""LongRoPE's second search: `short_factor`, the factors used within the original context
(Ding et al. 2024, section 3.3: the extended model's rotation is searched again at a length
the original model handled, to recover its short-context perplexity; Phi-3's published
`short_factor`s come from such a search).

    long = search(fit, fit.space(), ...).best                   # the first search
    short_fit = ShortFactors.after(fit, long)                   # windows of the original length
    result = search(short_fit, short_fit.space(), config, seeds=short_fit.seeds(space))
    short_fit.scaling(result.best)   # the longrope dict: long's long_factor, the found short

A candidate here is the short factors (`Candidate.steps`, start 0: n-hat belongs to the long
regime); the model's longrope dict keeps the long candidate's `long_factor` and the extension's
`factor` (so the attention factor, which LongRoPE applies in both regimes, is the long search's).
The windows are at most the original length, so the encoding runs its short regime: the same
fitness, the same one compiled program per search (`train.longrope.fitness`). The space's
bounds are the long search's ([1, max_ratio * s] for the extension's scale s); the seeds are
the original rotation (every factor 1) and the long candidate's factors.
"""

from __future__ import annotations

import numpy as np

from posenc_jax.checks import integer
from train.longrope import export
from train.longrope.fitness import Perplexity, windows
from train.longrope.space import Candidate, Space

__all__ = ["ShortFactors"]


class ShortFactors(Perplexity):
    """fitness(candidate) -> perplexity on windows of at most the original length of the model
    whose longrope dict has `long`'s long factors (for the extension to `extended` tokens) and
    the candidate as short_factor. Keywords as `Perplexity`'s, plus `extended` and `long`."""

    def __init__(self, model, tokens, *, original: int, extended: int, long: Candidate,
                 **kwargs):
        self.extended = integer("extended", extended, minimum=original + 1)
        self.long = long
        super().__init__(model, tokens, original=original, **kwargs)

    @classmethod
    def after(cls, fit: Perplexity, long: Candidate) -> ShortFactors:
        """The short search after the long search `fit` found `long`: the same model, and
        the same text cut into windows of the original length (as many as it holds)."""
        flat = np.asarray(fit.tokens).reshape(-1)
        tokens = windows(flat, target_length=fit.original, samples=flat.size // fit.original)
        return cls(fit.source, tokens, original=fit.original, extended=fit.target_length,
                   long=long, rebuild=fit.rebuild, where=fit.where, step=fit.step,
                   scan_layers=fit.scan_layers, chunk=fit.chunk)

    def _check_length(self) -> None:
        if self.target_length > self.original:
            raise ValueError(f"short_factor windows of {self.target_length} tokens must be at "
                             f"most {self.where}'s original context max_position_embeddings="
                             f"{self.original}")

    @property
    def scale(self) -> float:
        """The extension's scale (the space's bounds and the attention factor's)."""
        return self.extended / self.original

    def space(self, *, starts=(0,), **kwargs) -> Space:
        """The long search's bounds; start 0 only (n-hat is the long regime's)."""
        return super().space(starts=starts, **kwargs)

    def seeds(self, space: Space) -> list[Candidate]:
        """Every factor 1 (the original rotation), then the long candidate's factors."""
        ones = Candidate((space.low,) * space.pairs, space.starts[0])
        longs = Candidate(space.to_steps(self.long.factors(space.step)), space.starts[0])
        return [ones] if longs == ones else [ones, longs]

    def scaling(self, candidate: Candidate) -> dict:
        """The longrope dict: `long`'s long_factor, the candidate's short_factor."""
        return export.scaling_dict(self.long, step=self.step, target_length=self.extended,
                                   original_max_position_embeddings=self.original,
                                   short_factor=candidate.factors(self.step))

    def start(self, candidate: Candidate) -> int:
        """The long candidate's start count (the model that runs both regimes has one)."""
        return self.long.start
