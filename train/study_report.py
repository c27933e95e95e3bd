"""The length-extrapolation study's outputs: results.csv, report.md and extrapolation.png.

Pure functions of the study's result rows (no JAX), so they can be tested on made-up rows.
A row is a dict with the CSV columns below; `loss`, `ppl` are NaN and `tokens` 0 for an
evaluation that cannot be run (the learned table past its length), with the reason in `note`.

    python -m train.study_report --a=runs/study --b=runs/study_seed1   # seed-to-seed noise
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from train.study_plan import NO_SCALING

COLUMNS = ("encoding", "scaling", "train_len", "eval_len", "loss", "ppl", "tokens",
           "eval_seconds", "note")


def row_key(row: Mapping[str, Any]) -> tuple[str, str, int]:
    return (row["encoding"], row["scaling"], int(row["eval_len"]))


def label(encoding: str, scaling: str) -> str:
    """`rope`, `rope+yarn`, ...: the name of one line of the table and the plot."""
    return encoding if scaling == NO_SCALING else f"{encoding}+{scaling}"


def write_csv(path: str, rows: Iterable[Mapping[str, Any]]) -> None:
    """Writes the rows (sorted by encoding, scaling, eval length) atomically to `path`."""
    rows = sorted(rows, key=row_key)
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            out = dict(row)
            for key in ("loss", "ppl"):
                value = float(out[key])
                out[key] = "" if math.isnan(value) else f"{value:.6g}"
            out["eval_seconds"] = f"{float(out.get('eval_seconds', 0.0)):.2f}"
            out.setdefault("note", "")
            writer.writerow(out)
    os.replace(tmp, path)


def read_csv(path: str) -> list[dict[str, Any]]:
    """Reads results.csv back into rows (empty loss/ppl become NaN)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key in ("train_len", "eval_len", "tokens"):
            row[key] = int(row[key])
        for key in ("loss", "ppl", "eval_seconds"):
            row[key] = float(row[key]) if row[key] != "" else math.nan
    return rows


def _lines(rows: Sequence[Mapping[str, Any]], order: Sequence[str]) -> list[tuple[str, str]]:
    """(encoding, scaling) pairs: encodings in `order`, plain first, then its scalings."""
    pairs = sorted({(r["encoding"], r["scaling"]) for r in rows},
                   key=lambda p: (order.index(p[0]) if p[0] in order else len(order),
                                  p[0], p[1] != NO_SCALING, p[1]))
    return pairs


def _cell(row: Mapping[str, Any] | None, *, key: str = "ppl", fmt: str = "{:.2f}") -> str:
    if row is None:
        return "—"
    value = float(row[key])
    if math.isnan(value):
        return "n/a"
    return fmt.format(value)


def table(rows: Sequence[Mapping[str, Any]], *, train_len: int, order: Sequence[str] = (),
          key: str = "ppl", fmt: str = "{:.2f}") -> str:
    """A markdown table: one row per encoding[+scaling], one column per eval length."""
    lengths = sorted({int(r["eval_len"]) for r in rows})
    by_key = {row_key(r): r for r in rows}
    head = ["model"] + [f"{n}" + (" (= L)" if n == train_len else "") for n in lengths]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for encoding, scaling in _lines(rows, order):
        cells = [f"`{label(encoding, scaling)}`"]
        cells += [_cell(by_key.get((encoding, scaling, n)), key=key, fmt=fmt) for n in lengths]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The distinct notes of rows that could not be evaluated, as 'label at lengths: note'."""
    grouped: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        if r.get("note"):
            grouped.setdefault((label(r["encoding"], r["scaling"]), r["note"]), []).append(
                int(r["eval_len"]))
    return [f"`{name}` at {', '.join(map(str, sorted(ns)))}: {note}"
            for (name, note), ns in sorted(grouped.items())]


def plot(path: str, rows: Sequence[Mapping[str, Any]], *, train_len: int,
         order: Sequence[str] = (), title: str = "") -> None:
    """Perplexity against eval length (log2 x, log y), one line per encoding[+scaling].

    A scaling method's line starts from plain RoPE's point at L (factor 1 is the identity).
    """
    # The object API, not pyplot: no global backend switch, so a caller's (e.g. a
    # notebook's inline) plotting is left as it was, and it works on a headless machine.
    import matplotlib
    import matplotlib.ticker
    from matplotlib.figure import Figure

    by_key = {row_key(r): r for r in rows}
    fig = Figure(figsize=(9, 5.5), dpi=110)
    ax = fig.subplots()
    pairs = _lines(rows, order)
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


def markdown(rows: Sequence[Mapping[str, Any]], *, train_len: int, order: Sequence[str],
             sections: Mapping[str, str]) -> str:
    """The whole report.md: the ppl table, a loss table, notes, then the given sections."""
    parts = [f"# Length-extrapolation study (trained at L = {train_len})", "",
             ("Perplexity per byte on held-out windows (lower is better); columns are the "
              "evaluation lengths, `—` not evaluated, `n/a` cannot be evaluated (see notes)."),
             "",
             table(rows, train_len=train_len, order=order), "",
             "Loss (nats per byte):", "",
             table(rows, train_len=train_len, order=order, key="loss", fmt="{:.4f}"), ""]
    row_notes = notes(rows)
    if row_notes:
        parts += ["Notes:", ""] + [f"- {n}" for n in row_notes] + [""]
    for name, text in sections.items():
        parts += [f"## {name}", "", text.rstrip(), ""]
    return "\n".join(parts)


def write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def noise(rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of the signed relative ppl change (b - a) / a for the rows both runs
    evaluated, one row per encoding[+scaling] and one column per length, and a summary line."""
    a = {row_key(r): float(r["ppl"]) for r in rows_a}
    b = {row_key(r): float(r["ppl"]) for r in rows_b}
    both = {k: (b[k] - a[k]) / a[k] for k in a.keys() & b.keys()
            if not (math.isnan(a[k]) or math.isnan(b[k]))}
    if not both:
        return "(no rows in common)"
    lengths = sorted({k[2] for k in both})
    out = ["| model | " + " | ".join(map(str, lengths)) + " |", "|" + "---|" * (len(lengths) + 1)]
    for encoding, scaling in sorted({k[:2] for k in both},
                                    key=lambda p: (p[0], p[1] != NO_SCALING, p[1])):
        cells = [f"{both[(encoding, scaling, n)]:+.1%}" if (encoding, scaling, n) in both
                 else "—" for n in lengths]
        out.append(f"| `{label(encoding, scaling)}` | " + " | ".join(cells) + " |")
    changes = sorted(abs(v) for v in both.values())
    out += ["", (f"{len(changes)} evaluations: median |change| "
                 f"{changes[len(changes) // 2]:.1%}, max |change| {changes[-1]:.1%}.")]
    return "\n".join(out)


def main(argv: Sequence[str]) -> None:
    from absl import flags
    del argv
    a = os.path.join(flags.FLAGS.a, "results.csv")
    b = os.path.join(flags.FLAGS.b, "results.csv")
    print(noise(read_csv(a), read_csv(b)))


if __name__ == "__main__":
    from absl import app, flags
    flags.DEFINE_string("a", None, "a study workdir", required=True)
    flags.DEFINE_string("b", None, "another study workdir (e.g. another seed)", required=True)
    app.run(main)
