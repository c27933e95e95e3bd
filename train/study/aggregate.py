"""The study's rows summarised over seeds, and the tables that check claims against them.

Pure functions of result rows (no JAX, no files). A perplexity row has `encoding, scaling,
finetune_steps, finetune_len, seed, train_len, eval_len, ppl`; a passkey row `encoding,
scaling, finetune_steps, seed, train_len, eval_len, accuracy, trials`. A *line* is one curve of
the figures and one row of the tables: (encoding, scaling, finetune_steps, finetune_len).

    line_label(line)                       `rope`, `rope+yarn`, `rope+yarn ft@256`
    over_seeds(rows, key) -> {(line, eval_len): Spread}   median, min, max, seeds
    supported_multiple(curve, ref, train_len, tolerance) -> int
    supported_table(rows, ...), passkey_table(...), flat_but_blind(...)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from train.engine.scalings import NO_SCALING

Line = tuple[str, str, int, int]  # encoding, scaling, finetune_steps, finetune_len


def line_of(row: Mapping[str, Any]) -> Line:
    return (row["encoding"], row["scaling"], int(row.get("finetune_steps", 0) or 0),
            int(row.get("finetune_len", 0) or 0))


def line_label(line: Line) -> str:
    """`rope`, `rope+yarn` (zero-shot), `rope ft@256` / `rope+yarn ft@256` (fine-tuned)."""
    encoding, scaling, steps, length = line
    name = encoding if scaling == NO_SCALING else f"{encoding}+{scaling}"
    return f"{name} ft@{length}" if steps else name


@dataclasses.dataclass(frozen=True)
class Spread:
    """A value over seeds: the median, the extremes and the seeds it came from."""

    median: float
    low: float
    high: float
    seeds: tuple[int, ...]

    def cell(self, fmt: str = "{:.2f}") -> str:
        """`5.38` for one seed, `5.38 (5.21-5.60)` for several; `n/a` when NaN."""
        if math.isnan(self.median):
            return "n/a"
        if len(self.seeds) < 2:
            return fmt.format(self.median)
        return f"{fmt.format(self.median)} ({fmt.format(self.low)}-{fmt.format(self.high)})"


def spread(values: Sequence[float], seeds: Sequence[int]) -> Spread:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return Spread(math.nan, math.nan, math.nan, tuple(sorted(seeds)))
    return Spread(float(statistics.median(finite)), min(finite), max(finite),
                  tuple(sorted(seeds)))


def over_seeds(rows: Iterable[Mapping[str, Any]], key: str) -> dict[tuple[Line, int], Spread]:
    """{(line, eval_len): Spread of row[key] over the rows' seeds}."""
    grouped: dict[tuple[Line, int], list[tuple[float, int]]] = {}
    for r in rows:
        grouped.setdefault((line_of(r), int(r["eval_len"])), []).append(
            (float(r[key]), int(r.get("seed", 0) or 0)))
    return {k: spread([v for v, _ in vs], [s for _, s in vs]) for k, vs in grouped.items()}


def supported_multiple(curve: Mapping[int, float], *, ref: float, train_len: int,
                       tolerance: float = 0.10) -> int:
    """The largest m such that ppl <= (1 + tolerance) * ref at every evaluated multiple of L
    from L up to m * L (L itself counts as within when it was not evaluated: a scaling with
    factor 1 is the identity). 0 when even L is out; NaN (not evaluable) counts as out."""
    best = 0 if train_len in curve else 1
    for n in sorted(k for k in curve if k >= train_len and k % train_len == 0):
        if math.isnan(curve[n]) or curve[n] > (1 + tolerance) * ref:
            break
        best = n // train_len
    return best


def _per_seed_curves(rows: Iterable[Mapping[str, Any]]
                     ) -> dict[tuple[Line, int], dict[int, float]]:
    """{(line, seed): {eval_len: ppl}}."""
    out: dict[tuple[Line, int], dict[int, float]] = {}
    for r in rows:
        out.setdefault((line_of(r), int(r.get("seed", 0) or 0)), {})[int(r["eval_len"])] = \
            float(r["ppl"])
    return out


def supported(rows: Sequence[Mapping[str, Any]], *, train_len: int,
              tolerance: float = 0.10) -> dict[Line, Spread]:
    """{line: Spread over seeds of its supported multiple of L}; the reference is the
    perplexity at L of the same seed's model as pretrained (the encoding, no scaling, not
    fine-tuned), so fine-tuning and scaling are judged against the original quality."""
    curves = _per_seed_curves(rows)
    out: dict[Line, list[tuple[float, int]]] = {}
    for (line, seed), curve in curves.items():
        base = curves.get(((line[0], NO_SCALING, 0, 0), seed), {})
        ref = base.get(train_len, math.nan)
        if math.isnan(ref):
            continue
        value = supported_multiple(curve, ref=ref, train_len=train_len, tolerance=tolerance)
        out.setdefault(line, []).append((float(value), seed))
    return {line: spread([v for v, _ in vs], [s for _, s in vs]) for line, vs in out.items()}


def ordered_lines(lines: Iterable[Line], order: Sequence[str]) -> list[Line]:
    """Encodings in `order`; per encoding plain first, then zero-shot scalings, then
    fine-tuned lines."""
    def key(line: Line):
        enc = line[0]
        return (order.index(enc) if enc in order else len(order), enc, line[2] > 0,
                line[1] != NO_SCALING, line[1], line[3])
    return sorted(set(lines), key=key)


def value_table(stats: Mapping[tuple[Line, int], Spread], *, train_len: int,
                order: Sequence[str], fmt: str = "{:.2f}") -> str:
    """Markdown: one row per line, one column per eval length; cells median (min-max)."""
    lengths = sorted({n for _, n in stats})
    head = ["model"] + [f"{n}" + (" (= L)" if n == train_len else "") for n in lengths]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for line in ordered_lines((ln for ln, _ in stats), order):
        cells = [f"`{line_label(line)}`"] + [
            stats[(line, n)].cell(fmt) if (line, n) in stats else "—" for n in lengths]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _multiple(s: Spread | None) -> str:
    if s is None or math.isnan(s.median):
        return "—"
    text = f"{s.median:g}x"
    return text if s.low == s.high else f"{text} ({s.low:g}-{s.high:g}x)"


def supported_table(rows: Sequence[Mapping[str, Any]], *, train_len: int,
                    order: Sequence[str], claims: Mapping[str, str],
                    tolerance: float = 0.10) -> str:
    """Markdown: per encoding[+scaling], the claim (`claims`, by that label), the supported
    multiple of L zero-shot and after fine-tuning."""
    sup = supported(rows, train_len=train_len, tolerance=tolerance)
    zero = [ln for ln in ordered_lines(sup, order) if not ln[2]]
    tuned = {(ln[0], ln[1]): ln for ln in sup if ln[2]}
    for enc, sc in tuned:
        if (enc, sc, 0, 0) not in sup:
            zero.append((enc, sc, 0, 0))
    out = ["| method | claimed | zero-shot (ours) | after fine-tuning (ours) |",
           "|---|---|---|---|"]
    for line in zero:
        name = line[0] if line[1] == NO_SCALING else f"{line[0]}+{line[1]}"
        claim = claims.get(name, "") or "—"
        ft = tuned.get((line[0], line[1]))
        ft_text = _multiple(sup.get(ft)) + (f" (ft@{ft[3]}, {ft[2]} steps)" if ft else "")
        out.append(f"| `{name}` | {claim} | {_multiple(sup.get(line))} | "
                   f"{ft_text if ft else '—'} |")
    return "\n".join(out)


def flat_but_blind(ppl_rows: Sequence[Mapping[str, Any]],
                   passkey_rows: Sequence[Mapping[str, Any]], *, train_len: int,
                   order: Sequence[str], tolerance: float = 0.10) -> tuple[str, list[str]]:
    """(markdown table, the lines whose perplexity stays within `tolerance` of L at the
    longest passkey length but whose retrieval there is below half)."""
    ppl = {(ln[0], ln[1], ln[3], n): v for (ln, n), v in over_seeds(ppl_rows, "ppl").items()}
    acc = over_seeds(passkey_rows, "accuracy")
    lengths = sorted({n for _, n in acc})
    if not lengths:
        return "(no passkey rows)", []
    far = lengths[-1]
    head = ["model", f"ppl {far} / ppl L"] + [f"passkey {n}" for n in lengths]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    blind = []
    for line in ordered_lines((ln for ln, _ in acc), order):
        base = ppl.get((line[0], NO_SCALING, 0, train_len))
        at_far = ppl.get((line[0], line[1], line[3], far))  # fine-tuned alike, any steps
        ratio = at_far.median / base.median if at_far and base else math.nan
        cells = [f"`{line_label(line)}`", "—" if math.isnan(ratio) else f"{ratio:.2f}"]
        cells += [acc[(line, n)].cell("{:.2f}") if (line, n) in acc else "—" for n in lengths]
        out.append("| " + " | ".join(cells) + " |")
        far_acc = acc.get((line, far))
        if ratio <= 1 + tolerance and far_acc is not None and far_acc.median < 0.5:
            blind.append(line_label(line))
    return "\n".join(out), blind
