"""The study's result rows as tables: results.csv's text and back, markdown tables, noise.

Pure functions of the rows (no JAX, no files), so they can be tested on made-up rows. A row is
a dict with the CSV columns below; `loss`, `ppl` are NaN and `tokens` 0 for an evaluation that
cannot be run (an encoding past the positions it can encode), with the reason in `note`.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from train.study.jobs import NO_SCALING

COLUMNS = ("encoding", "scaling", "train_len", "eval_len", "loss", "ppl", "tokens",
           "eval_seconds", "note")


def row_key(row: Mapping[str, Any]) -> tuple[str, str, int]:
    return (row["encoding"], row["scaling"], int(row["eval_len"]))


def label(encoding: str, scaling: str) -> str:
    """`rope`, `rope+yarn`, ...: the name of one line of the table and the plot."""
    return encoding if scaling == NO_SCALING else f"{encoding}+{scaling}"


def csv_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """results.csv's text: the rows sorted by encoding, scaling, eval length."""
    out_file = io.StringIO(newline="")
    writer = csv.DictWriter(out_file, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in sorted(rows, key=row_key):
        out = dict(row)
        for key in ("loss", "ppl"):
            value = float(out[key])
            out[key] = "" if math.isnan(value) else f"{value:.6g}"
        out["eval_seconds"] = f"{float(out.get('eval_seconds', 0.0)):.2f}"
        out.setdefault("note", "")
        writer.writerow(out)
    return out_file.getvalue()


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


def lines(rows: Sequence[Mapping[str, Any]], order: Sequence[str]) -> list[tuple[str, str]]:
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
    for encoding, scaling in lines(rows, order):
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
