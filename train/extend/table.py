"""The extension study's result rows as tables: pure functions of the stored rows.

    ppl_rows(results)         one row per (model, method, length, text), `none`'s shorter
                              lengths read from its longest forward's prefixes
    supported(...)            the chapter's table: per model and method, the longest length
                              at which perplexity stays within `tolerance` of the model's own
                              at its context C, and passkey accuracy stays >= `threshold`
CSV text is the engine's (`train.engine.output.csv_text`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from train.engine.scalings import NO_SCALING

PPL_COLUMNS = ("model", "method", "context", "length", "factor", "text", "ppl", "loss",
               "tokens", "seconds", "derived_from")
BUCKET_COLUMNS = ("model", "method", "context", "length", "factor", "text", "start", "end",
                  "ppl")
PASSKEY_COLUMNS = ("model", "method", "context", "length", "factor", "trials", "correct",
                   "accuracy", "seconds")


def ppl_rows(results: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The perplexity rows (kind ppl) plus one per stored prefix (`none` at shorter lengths:
    the first m positions of a causal forward are the forward at m)."""
    out = []
    for r in results:
        if "prefix_ppl" not in r:
            continue
        out.append({k: r.get(k, "") for k in PPL_COLUMNS if k != "derived_from"}
                   | {"derived_from": ""})
        for m, ppl in r["prefix_ppl"].items():
            out.append({**{k: r[k] for k in ("model", "method", "context", "factor", "text")},
                        "length": int(m), "ppl": ppl, "loss": math.log(ppl),
                        "tokens": int(m), "seconds": 0.0,
                        "derived_from": f"first {m} positions of the {r['length']} forward"})
    return sorted(out, key=lambda r: (r["model"], r["text"], r["method"] != NO_SCALING,
                                      r["method"], r["length"]))


def bucket_rows(results: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{**{k: r[k] for k in ("model", "method", "context", "length", "factor", "text")},
             "start": a, "end": b, "ppl": p}
            for r in results if "buckets" in r for a, b, p in r["buckets"]]


def passkey_rows(results: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return sorted(({k: r[k] for k in PASSKEY_COLUMNS} for r in results if "answers" in r),
                  key=lambda r: (r["model"], r["method"] != NO_SCALING, r["method"],
                                 r["length"]))


def curve(rows: Sequence[Mapping[str, Any]], *, model: str, method: str, key: str,
          text: str | None = None) -> dict[int, float]:
    """{length: rows' `key`} of one line; a method at lengths <= C (factor 1, the identity)
    takes `none`'s value."""
    def of(m):
        return {int(r["length"]): float(r[key]) for r in rows if r["model"] == model
                and r["method"] == m and (text is None or r.get("text") == text)}
    mine = of(method)
    if method == NO_SCALING:
        return mine
    context = next((int(r["context"]) for r in rows if r["model"] == model), 0)
    return {**{n: v for n, v in of(NO_SCALING).items() if n <= context}, **mine}


def longest(values: Mapping[int, float], ok, *, start: int = 0) -> int:
    """The largest length n >= `start` such that ok(value) at every length from `start` (or
    the smallest length) to n; 0 when the first already fails; NaN fails."""
    best = 0
    for n in sorted(k for k in values if k >= start):
        v = values[n]
        if math.isnan(v) or not ok(v):
            break
        best = n
    return best


def supported(ppl: Sequence[Mapping[str, Any]], passkey: Sequence[Mapping[str, Any]], *,
              model: str, methods: Sequence[str], context: int, texts: Sequence[str],
              tolerance: float = 0.10, threshold: float = 0.9) -> list[dict[str, Any]]:
    """Per method: {method, ppl_len (worst over texts), passkey_len, both, ref (per text)}."""
    out = []
    refs = {t: curve(ppl, model=model, method=NO_SCALING, key="ppl", text=t).get(context,
                                                                                 math.nan)
            for t in texts}
    for method in methods:
        lens = []
        for t in texts:
            c = curve(ppl, model=model, method=method, key="ppl", text=t)
            lens.append(longest(c, lambda v, r=refs[t]: v <= (1 + tolerance) * r,
                                start=context) if c and not math.isnan(refs[t]) else 0)
        pk = curve(passkey, model=model, method=method, key="accuracy")
        pk_len = longest(pk, lambda v: v >= threshold) if pk else None
        ppl_len = min(lens) if lens else None
        both = min(x for x in (ppl_len, pk_len) if x is not None) if (
            ppl_len is not None or pk_len is not None) else None
        out.append({"method": method, "ppl_len": ppl_len, "passkey_len": pk_len,
                    "both": both, "refs": refs})
    return out
