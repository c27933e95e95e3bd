"""The study's result rows as tables: results.csv's text and back, markdown tables, noise.

Pure functions of the rows (no JAX, no files), so they can be tested on made-up rows. A row is
a dict with the CSV columns below; `loss`, `ppl` are NaN and `tokens` 0 for an evaluation that
cannot be run (an encoding past the positions it can encode), with the reason in `note`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from train.engine.output import csv_text as engine_csv
from train.engine.scalings import NO_SCALING

# The first nine are the columns results.csv always had (readers of older files keep working).
COLUMNS = ("encoding", "scaling", "train_len", "eval_len", "loss", "ppl", "tokens",
           "eval_seconds", "note", "finetune_steps", "finetune_len", "seed")
PASSKEY_COLUMNS = ("encoding", "scaling", "finetune_steps", "train_len", "eval_len", "accuracy",
                   "trials", "seed", "finetune_len", "correct", "digit_accuracy",
                   "eval_seconds", "note")
_INTS = ("train_len", "eval_len", "tokens", "finetune_steps", "finetune_len", "seed", "trials",
         "correct")
_FLOATS = ("loss", "ppl", "eval_seconds", "accuracy", "digit_accuracy")


def row_key(row: Mapping[str, Any]) -> tuple[str, str, int, int, int, int]:
    """(encoding, scaling, finetune_steps, finetune_len, seed, eval_len)."""
    return (row["encoding"], row["scaling"], int(row.get("finetune_steps", 0) or 0),
            int(row.get("finetune_len", 0) or 0), int(row.get("seed", 0) or 0),
            int(row["eval_len"]))


def label(encoding: str, scaling: str, finetune_len: int = 0) -> str:
    """`rope`, `rope+yarn`, `rope+yarn ft@256`: the name of one line of the tables and plots."""
    name = encoding if scaling == NO_SCALING else f"{encoding}+{scaling}"
    return f"{name} ft@{finetune_len}" if finetune_len else name


def _cells(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as results.csv writes it: defaults filled, NaN empty, seconds to 0.01."""
    out = {"note": "", "finetune_steps": 0, "finetune_len": 0, "seed": 0, **row}
    for key in ("loss", "ppl", "accuracy", "digit_accuracy"):
        if key in out:
            value = float(out[key])
            out[key] = "" if math.isnan(value) else f"{value:.6g}"
    out["eval_seconds"] = f"{float(out.get('eval_seconds', 0.0)):.2f}"
    return out


def _csv(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    return engine_csv((_cells(r) for r in sorted(rows, key=row_key)), columns)


def csv_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """results.csv's text: the rows sorted by `row_key`."""
    return _csv(rows, COLUMNS)


def passkey_csv_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """passkey.csv's text: the rows sorted by `row_key`."""
    return _csv(rows, PASSKEY_COLUMNS)


def read_csv(path: str) -> list[dict[str, Any]]:
    """Reads results.csv or passkey.csv back into rows (empty numbers become NaN; columns a
    older file lacks are absent)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key in (k for k in _INTS if k in row):
            row[key] = int(row[key])
        for key in (k for k in _FLOATS if k in row):
            row[key] = float(row[key]) if row[key] != "" else math.nan
    return rows


def notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The distinct notes of rows that could not be evaluated, as 'label at lengths: note'."""
    grouped: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        if r.get("note"):
            name = label(r["encoding"], r["scaling"], int(r.get("finetune_len", 0) or 0))
            grouped.setdefault((name, r["note"]), []).append(int(r["eval_len"]))
    return [f"`{name}` at {', '.join(map(str, sorted(set(ns))))}: {note}"
            for (name, note), ns in sorted(grouped.items())]


def noise(rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of the signed relative ppl change (b - a) / a for the rows both runs
    evaluated (matched on everything but the seed), one row per line and one column per
    length, and a summary line."""
    def by_line(rows):
        return {(label(r["encoding"], r["scaling"], int(r.get("finetune_len", 0) or 0)),
                 int(r["eval_len"])): float(r["ppl"]) for r in rows}

    a, b = by_line(rows_a), by_line(rows_b)
    both = {k: (b[k] - a[k]) / a[k] for k in a.keys() & b.keys()
            if not (math.isnan(a[k]) or math.isnan(b[k]))}
    if not both:
        return "(no rows in common)"
    lengths = sorted({k[1] for k in both})
    out = ["| model | " + " | ".join(map(str, lengths)) + " |", "|" + "---|" * (len(lengths) + 1)]
    for name in sorted({k[0] for k in both}):
        cells = [f"{both[(name, n)]:+.1%}" if (name, n) in both else "—" for n in lengths]
        out.append(f"| `{name}` | " + " | ".join(cells) + " |")
    changes = sorted(abs(v) for v in both.values())
    out += ["", (f"{len(changes)} evaluations: median |change| "
                 f"{changes[len(changes) // 2]:.1%}, max |change| {changes[-1]:.1%}.")]
    return "\n".join(out)
