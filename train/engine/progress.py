"""The one progress bar of a study run, over estimated seconds.

    b = bar(total_seconds, name="study", progress=True)
    advance(b, seconds_of_the_finished_job)
"""

from __future__ import annotations

import tqdm


def bar(total: float, *, name: str, progress: bool):
    """A tqdm bar over `total` estimated seconds, prefixed by the study's `name`."""
    return tqdm.tqdm(total=total, unit="s(est)", disable=not progress, dynamic_ncols=True,
                     position=0, bar_format=name + " {percentage:3.0f}%|{bar}| {postfix} "
                                                   "[{elapsed}<{remaining}]")


def advance(b, amount: float) -> None:
    """Moves `b` on by `amount`, never past its total: workers finish jobs in another order
    than the plan's, and float sums in another order overshot it ("TqdmWarning: clamping frac
    to range [0, 1]", a remaining time of -00:00)."""
    b.update(max(0.0, min(amount, b.total - b.n)))
