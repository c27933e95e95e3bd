"""The study's figure: perplexity against evaluation length, one line per encoding[+scaling].

A pure function of the result rows (see `report`); the object API of matplotlib, not pyplot,
so no global backend is switched (a notebook's inline plotting is left as it was) and it works
on a headless machine.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import matplotlib.ticker
from matplotlib.figure import Figure

from train.study.jobs import NO_SCALING
from train.study.table import label, lines, row_key


def plot(path: str, rows: Sequence[Mapping[str, Any]], *, train_len: int,
         order: Sequence[str] = (), title: str = "") -> None:
    """Perplexity against eval length (log2 x, log y), one line per encoding[+scaling].

    A scaling method's line starts from plain RoPE's point at L (factor 1 is the identity).
    """
    by_key = {row_key(r): r for r in rows}
    fig = Figure(figsize=(9, 5.5), dpi=110)
    ax = fig.subplots()
    pairs = lines(rows, order)
    plain = [p for p in pairs if p[1] == NO_SCALING]
    colors = {enc: matplotlib.colormaps["tab10"](i % 10) for i, (enc, _) in enumerate(plain)}
    scaled = [p for p in pairs if p[1] != NO_SCALING]
    scaled_colors = [matplotlib.colormaps["Dark2"](i % 8) for i in range(len(scaled))]
    styles = ["--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1))]
    for encoding, scaling in pairs:
        points = sorted((n, float(r["ppl"])) for (e, s, n), r in by_key.items()
                        if (e, s) == (encoding, scaling) and not math.isnan(float(r["ppl"])))
        if scaling != NO_SCALING:
            anchor = by_key.get((encoding, NO_SCALING, train_len))
            if anchor is not None and not math.isnan(float(anchor["ppl"])):
                points = [(train_len, float(anchor["ppl"]))] + [p for p in points
                                                                 if p[0] > train_len]
        if not points:
            continue
        xs, ys = zip(*points)
        missing = [n for (e, s, n), r in by_key.items()
                   if (e, s) == (encoding, scaling) and math.isnan(float(r["ppl"]))]
        name = label(encoding, scaling) + (f" (n/a from {min(missing)})" if missing else "")
        if scaling == NO_SCALING:
            ax.plot(xs, ys, "-o", color=colors.get(encoding), lw=2, ms=4, label=name)
        else:
            i = scaled.index((encoding, scaling))
            ax.plot(xs, ys, linestyle=styles[i % len(styles)], marker="s", ms=3, lw=1.5,
                    color=scaled_colors[i], label=name)
    ax.axvline(train_len, color="gray", lw=1, ls="--")
    ax.text(train_len, 0.01, f" L={train_len}", transform=ax.get_xaxis_transform(),
            va="bottom", ha="left", color="gray", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    finite = [float(r["ppl"]) for r in rows if not math.isnan(float(r["ppl"]))]
    span = max(finite) / min(finite) if finite else 10.0
    subs = tuple(range(1, 10)) if span < 4 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if span < 30 \
        else (1.0, 2.0, 5.0)
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=subs))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    lengths = sorted({int(r["eval_len"]) for r in rows})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title(title or f"Length extrapolation, trained at L={train_len}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp)
    os.replace(tmp, path)
