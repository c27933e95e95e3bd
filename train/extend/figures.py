"""The extension study's two figures per model (matplotlib's object API, headless).

    position_figure(path, buckets, model=, context=)   perplexity over position buckets, one
                                                       line per method at its longest length
    passkey_figure(path, passkey, model=, context=)    passkey accuracy against length
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from train.engine.output import save_figure
from train.engine.scalings import NO_SCALING
from train.extend.table import curve


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _style(i: int, method: str) -> dict:
    color = "black" if method == NO_SCALING else matplotlib.colormaps["tab10"](i % 10)
    return {"color": color, "lw": 2.2 if method == NO_SCALING else 1.4, "marker": "o",
            "ms": 3}


def position_figure(path: str, buckets: Sequence[Mapping[str, Any]], *, model: str,
                    context: int, methods: Sequence[str], texts: Sequence[str]) -> None:
    """One panel per text: x the position buckets, y perplexity (log), a line per method
    from its longest forward (factor = that length / C)."""
    fig = Figure(figsize=(6.5 * len(texts), 4.8), dpi=100)
    axes = fig.subplots(1, len(texts), squeeze=False)[0]
    for ax, text in zip(axes, texts):
        rows = [r for r in buckets if r["model"] == model and r["text"] == text]
        for i, method in enumerate(methods):
            mine = [r for r in rows if r["method"] == method]
            if not mine:
                continue
            n = max(int(r["length"]) for r in mine)
            pts = sorted((int(r["start"]), int(r["end"]), float(r["ppl"])) for r in mine
                         if int(r["length"]) == n)
            factor = float(mine[0]["factor"]) if method == NO_SCALING else n / context
            label = method if method == NO_SCALING else f"{method} (x{factor:g})"
            ax.plot(range(len(pts)), [p for _, _, p in pts], label=label,
                    **_style(i, method))
            ax.set_xticks(range(len(pts)), [f"[{_k(a)},{_k(b)})" for a, b, _ in pts],
                          fontsize=8)
        ax.set_yscale("log")
        if len(ax.get_xticks()) > 3:  # buckets 0-2 are [0, C)
            ax.axvline(2.5, color="gray", lw=1, ls="--")
        ax.set_xlabel(f"position bucket (C = {_k(context)}: dashed line)")
        ax.set_ylabel("perplexity (log scale)")
        ax.set_title(f"{model}, {text}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle("Perplexity by position, zero-shot", fontsize=11)
    save_figure(fig, path)


def passkey_figure(path: str, passkey: Sequence[Mapping[str, Any]], *, model: str,
                   context: int, methods: Sequence[str]) -> None:
    """Accuracy (exact key) against prompt length (log2), a line per method."""
    fig = Figure(figsize=(6.5, 4.5), dpi=100)
    ax = fig.subplots()
    lengths = set()
    for i, method in enumerate(methods):
        c = curve(passkey, model=model, method=method, key="accuracy")
        pts = sorted((n, v) for n, v in c.items() if not math.isnan(v))
        if not pts:
            continue
        lengths |= {n for n, _ in pts}
        ax.plot([n for n, _ in pts], [v for _, v in pts], label=method, **_style(i, method))
    ax.axvline(context, color="gray", lw=1, ls="--")
    ax.set_xscale("log", base=2)
    if lengths:
        ax.set_xticks(sorted(lengths), [_k(n) for n in sorted(lengths)])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(f"prompt length (tokens; C = {_k(context)} dashed)")
    ax.set_ylabel("passkey accuracy (exact key)")
    ax.set_title(f"Passkey retrieval, {model}, zero-shot", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    save_figure(fig, path)
