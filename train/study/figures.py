"""The study's two figures, with the seed-to-seed spread as error bars.

    perplexity_figure(path, stats, train_len=, order=)   extrapolation.png
    passkey_figure(path, stats, train_len=, order=)      passkey.png

`stats` is `summary.over_seeds(rows, key)`: {(line, eval_len): Spread}. Each point is the
median over seeds, its bar the min-max range (no bar for one seed). The left panel holds the
models as trained (and zero-shot scalings, dashed); the right one, when there are fine-tuned
lines, the fine-tuned models beside their zero-shot counterparts. Matplotlib's object API, no
pyplot: no global backend is switched, and it runs headless.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib
import matplotlib.ticker
from matplotlib.figure import Figure

from train.engine.output import save_figure
from train.engine.scalings import NO_SCALING
from train.study.aggregate import Line, Spread, line_label, ordered_lines

_STYLES = ["--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1))]
_PAST_TAB10 = ("black", "darkgoldenrod", "darkslateblue", "olive", "teal", "maroon")


def _plain_color(i: int):
    """The i-th encoding's colour: tab10's ten, then six more (with diamond markers), so
    no two of the first 16 encodings share a colour."""
    return matplotlib.colormaps["tab10"](i) if i < 10 else _PAST_TAB10[(i - 10) % 6]


def _draw(ax, stats: Mapping[tuple[Line, int], Spread], lines: Sequence[Line], *,
          train_len: int, anchor: bool) -> None:
    plain = [ln for ln in lines if ln[1] == NO_SCALING and not ln[2]]
    colors = {ln[0]: _plain_color(i) for i, ln in enumerate(plain)}
    markers = {ln[0]: "o" if i < 10 else "D" for i, ln in enumerate(plain)}
    others = [ln for ln in lines if ln not in plain]
    dark = {ln: matplotlib.colormaps["Dark2"](i % 8) for i, ln in enumerate(
        sorted({(ln[0], ln[1]) for ln in others}))}
    for line in lines:
        points = sorted((n, s) for (ln, n), s in stats.items()
                        if ln == line and not math.isnan(s.median))
        if anchor and line[1] != NO_SCALING and not line[2]:  # factor 1 is the identity
            base = stats.get(((line[0], NO_SCALING, 0, 0), train_len))
            if base is not None and all(n > train_len for n, _ in points):
                points = [(train_len, base)] + points
        if not points:
            continue
        xs = [n for n, _ in points]
        ys = [s.median for _, s in points]
        err = [[s.median - s.low for _, s in points], [s.high - s.median for _, s in points]]
        if line in plain:
            kw = {"color": colors[line[0]], "fmt": "-" + markers[line[0]], "lw": 2, "ms": 4}
        else:
            i = others.index(line)
            kw = {"color": dark[(line[0], line[1])], "marker": "s" if line[2] else "^",
                  "ms": 3, "lw": 1.8 if line[2] else 1.2,
                  "linestyle": "-" if line[2] else _STYLES[i % len(_STYLES)]}
        ax.errorbar(xs, ys, yerr=err, capsize=2, elinewidth=0.8, label=line_label(line), **kw)
    ax.axvline(train_len, color="gray", lw=1, ls="--")
    ax.text(train_len, 0.01, f" L={train_len}", transform=ax.get_xaxis_transform(),
            va="bottom", ha="left", color="gray", fontsize=8)
    ax.set_xscale("log", base=2)
    lengths = sorted({n for _, n in stats})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("evaluation length (tokens)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best", frameon=False)


def _panels(stats, order):
    lines = ordered_lines((ln for ln, _ in stats), order)
    tuned = [ln for ln in lines if ln[2]]
    if not tuned:
        return [(lines, "")]
    keys, encodings = {(ln[0], ln[1]) for ln in tuned}, {ln[0] for ln in tuned}
    right = [ln for ln in lines if ln[2] or (ln[0], ln[1]) in keys
             or (ln[1] == NO_SCALING and ln[0] in encodings)]
    left = [ln for ln in lines if not ln[2]]
    return [(left, "as trained (dashed: zero-shot scaling)"),
            (right, f"fine-tuned at {tuned[0][3]} (solid) vs zero-shot")]


def perplexity_figure(path: str, stats: Mapping[tuple[Line, int], Spread], *,
                      train_len: int, order: Sequence[str] = (), note: str = "") -> None:
    """Perplexity (log) against eval length (log2), median over seeds with min-max bars."""
    panels = _panels(stats, order)
    fig = Figure(figsize=(7 * len(panels), 5.5), dpi=100)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (lines, title) in zip(axes, panels):
        _draw(ax, stats, lines, train_len=train_len, anchor=True)
        ax.set_yscale("log")
        finite = [s.median for (ln, _), s in stats.items() if ln in lines
                  and not math.isnan(s.median)]
        span = max(finite) / min(finite) if finite else 10.0
        subs = tuple(range(1, 10)) if span < 4 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) \
            if span < 30 else (1.0, 2.0, 5.0)
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=subs))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylabel("perplexity per byte (log scale)")
        ax.set_title(title or f"trained at L={train_len}", fontsize=10)
    fig.suptitle(f"Length extrapolation, trained at L={train_len}{note}", fontsize=11)
    save_figure(fig, path)


def passkey_figure(path: str, stats: Mapping[tuple[Line, int], Spread], *,
                   train_len: int, order: Sequence[str] = (), note: str = "") -> None:
    """Passkey retrieval accuracy against eval length, median over seeds, min-max bars."""
    panels = _panels(stats, order)
    fig = Figure(figsize=(7 * len(panels), 5), dpi=100)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (lines, title) in zip(axes, panels):
        _draw(ax, stats, lines, train_len=train_len, anchor=False)
        ax.set_ylim(-0.03, 1.03)
        ax.set_ylabel("passkey accuracy (exact key)")
        ax.set_title(title or f"trained at L={train_len}", fontsize=10)
    fig.suptitle(f"Passkey retrieval, trained at L={train_len}{note}", fontsize=11)
    save_figure(fig, path)
