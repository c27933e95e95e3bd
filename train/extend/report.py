"""The extension study's files: report.md, ppl.csv, buckets.csv, passkey.csv, the figures.

    summary(plan, todo, total=, cost=)    the line printed before the first job
    describe(job, row)                    a few words for the progress bar
    write_all(ctx, results, timings) -> [paths]   the study record's `report`
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from train.engine.output import csv_text, machine
from train.engine.scalings import NO_SCALING
from train.engine.store import write_text
from train.extend import figures, table
from train.extend.plan import Plan

FINETUNE_COMMAND = "bash scripts/device_check.sh OUT   # section extend_finetune"


def summary(plan: Plan, todo, *, total: float, cost, calibrated_s: float = 0.0) -> str:
    kinds = {k: sum(1 for j in todo if j.kind == k) for k in ("ppl", "passkey")}
    attn = ("" if cost.attention_flops_per_s is None else
            f", one layer's attention over {plan.settings.calibrate_attention_len} tokens at "
            f"{cost.attention_flops_per_s / 1e9:.1f} GFLOP/s")
    return (f"extend: models {list(plan.models)}, methods {list(plan.methods)}, lengths "
            f"{ {m: list(v) for m, v in plan.lengths.items()} }; to do: {kinds['ppl']} "
            f"perplexity and {kinds['passkey']} passkey jobs of {len(plan.jobs)}; estimated "
            f"{total / 60:.1f} min after {calibrated_s / 60:.1f} min of calibration (here: "
            "one forward of "
            f"{plan.settings.calibrate_len} tokens ran its matmuls at "
            f"{cost.flops_per_s / 1e9:.1f} GFLOP/s{attn}, compile {cost.compile_s:.1f} s, "
            f"load {cost.load_s:.1f} s; jobs = FLOPs / those rates + compiles + a load: "
            "`train.extend.estimate`) -- an estimate, not a measurement")


def describe(job, row: Mapping[str, Any]) -> str:
    del job  # the row names it
    value = (f"ppl={row['ppl']:.3f}" if "ppl" in row
             else f"passkey={row['correct']}/{row['trials']}")
    return f"{row['model']}+{row['method']}@{row['length']} {value}"


def _len(n: int | None, context: int) -> str:
    if n is None:
        return "not measured"
    if n == 0:
        return "none"
    return f"{n} ({n / context:g} C)"


def _grid(rows, *, model, methods, lengths, key, text=None, fmt="{:.3f}") -> list[str]:
    head = "| method | " + " | ".join(str(n) for n in lengths) + " |"
    out = [head, "|" + "---|" * (len(lengths) + 1)]
    for m in methods:
        c = table.curve(rows, model=model, method=m, key=key, text=text)
        cells = [fmt.format(c[n]) if n in c and not math.isnan(c[n]) else "" for n in lengths]
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    return out


def _model_section(plan: Plan, model: str, ppl, buckets, passkey) -> list[str]:
    cfg, context, lengths = plan.settings, plan.contexts[model], plan.lengths[model]
    texts = list(cfg.texts)
    sup = table.supported(ppl, passkey, model=model, methods=plan.methods, context=context,
                          texts=texts, tolerance=cfg.tolerance,
                          threshold=cfg.passkey_threshold)
    out = [f"## {model} (context C = {context}; {cfg.model(model).file})", "",
           f"Supported length, zero-shot: the longest length at which perplexity stays within "
           f"{cfg.tolerance:.0%} of the model's own at C (on every text: "
           + ", ".join(f"{t} {r:.3f}" for t, r in sup[0]["refs"].items())
           + f") and passkey accuracy stays >= {cfg.passkey_threshold} (at every length "
           "measured up to it).", "",
           "| method | perplexity within 10% up to | passkey >= 0.9 up to | both |",
           "|---|---|---|---|"]
    pk_max = max((int(r["length"]) for r in passkey if r["model"] == model), default=0)
    ppl_max = max((int(r["length"]) for r in ppl if r["model"] == model), default=0)

    def bound(n, longest):  # a criterion that held at the longest length measured
        return _len(n, context) + ("; the longest measured" if n and n == longest
                                   and longest < ppl_max else "")
    for s in sup:
        out.append(f"| {s['method']} | {_len(s['ppl_len'], context)} | "
                   f"{bound(s['passkey_len'], pk_max)} | {bound(s['both'], pk_max)} |")
    if 0 < pk_max < ppl_max:
        out += ["", (f"Passkey was measured up to {pk_max} tokens only (config.passkey.lengths): "
                "the passkey and both columns cannot go past it.")]
    out += ["", (f"| YaRN fine-tuned to 4C ({4 * context}) | not yet measured | not yet "
                f"measured | `{FINETUNE_COMMAND}` |"), ""]
    for text in texts:
        out += [(f"Perplexity of the first n tokens of `{text}` (none at n < its longest "
                "length: the prefix of that forward):"), ""]
        out += _grid(ppl, model=model, methods=plan.methods, lengths=lengths, key="ppl",
                     text=text) + [""]
        rows = [r for r in buckets if r["model"] == model and r["text"] == text]
        longest = {m: max((int(r["length"]) for r in rows if r["method"] == m), default=0)
                   for m in plan.methods}
        spans = sorted({(int(r["start"]), int(r["end"])) for r in rows})
        if spans:
            out += [(f"Perplexity by position bucket (`{text}`), each method at its longest "
                    "length:"), "", "| method (length) | " + " | ".join(
                        f"[{a}, {b})" for a, b in spans) + " |", "|" + "---|" * (len(spans) + 1)]
            for m in plan.methods:
                cell = {(int(r["start"]), int(r["end"])): float(r["ppl"]) for r in rows
                        if r["method"] == m and int(r["length"]) == longest[m]}
                if cell:
                    out.append(f"| {m} ({longest[m]}) | " + " | ".join(
                        f"{cell[s]:.3f}" if s in cell else "" for s in spans) + " |")
            out.append("")
    pk_lengths = sorted({int(r["length"]) for r in passkey if r["model"] == model})
    if pk_lengths:
        out += ["Passkey accuracy (exact key; greedy decoding with the KV cache):", ""]
        out += _grid(passkey, model=model, methods=plan.methods, lengths=pk_lengths,
                     key="accuracy", fmt="{:.2f}") + [""]
    out += [f"![perplexity by position](ppl_by_position_{model}.png)",
            f"![passkey](passkey_{model}.png)", ""]
    return out


def _scaling_notes(plan: Plan, results) -> list[str]:
    seen, out = set(), ["## The scaling dicts (as Hugging Face writes `rope_scaling`)", "",
                        ("factor = length / C; the registry's `stretch` rule of each method "
                        "(`posenc_jax.encodings.rope_scaling.registry`): linear, ntk, dynamic, "
                        "yarn take the factor (and C as original_max_position_embeddings; "
                        "YaRN's betas at their defaults 32 / 1); llama3: Llama 3.1's band "
                        "edges, low_freq_factor 1 and high_freq_factor 4 (wavelengths C and "
                        "C/4); longrope: no search, the NTK-aware per-dimension rule "
                        "long_factor_i = factor^(2i / (d - 2)), short_factor 1. Dynamic grows "
                        "with the sequence by itself (factor given, frequencies from the "
                        "current length)."), ""]
    for job in plan.jobs:
        if job.method != NO_SCALING and (job.model, job.method) not in seen:
            last = max(j.length for j in plan.jobs
                       if j.model == job.model and j.method == job.method)
            sc = next(j for j in plan.jobs if j.model == job.model and j.method == job.method
                      and j.length == last).rope_scaling
            if "long_factor" in sc:
                sc = {**sc, "long_factor": f"[{len(sc['long_factor'])} values]",
                      "short_factor": f"[{len(sc['short_factor'])} values]"}
            out.append(f"- {job.model} {job.method} at {last}: `{json.dumps(sc)}`")
            seen.add((job.model, job.method))
    return out + [""]


def _timing(plan: Plan, results, timings: Sequence[Mapping[str, Any]]) -> list[str]:
    out = ["## Time", ""]
    for t in timings:
        est, cal = t.get("estimate_s"), t.get("calibrate_s", 0.0)
        said = ("" if est is None else
                f"{est / 60:.1f} min after {cal / 60:.1f} min of calibration, ")
        out.append(f"- {t['started']}: {t['jobs']} jobs, estimated {said}took "
                   f"{t.get('wall_s', 0) / 60:.1f} min; load average at start "
                   f"{', '.join(f'{x:.1f}' for x in t.get('load_at_start', []))}")
    spent = sum(float(r.get("seconds", 0.0)) for r in results.values())
    return out + [f"- sum of the jobs' own seconds: {spent / 60:.1f} min", "", machine(), ""]


def write_all(ctx, results: Mapping, timings: Sequence[Mapping[str, Any]]) -> list[str]:
    """report.md, ppl.csv, buckets.csv, passkey.csv and two figures per model; their paths."""
    plan: Plan = ctx.plan
    workdir = plan.workdir
    rows = list(results.values())
    ppl, buckets, passkey = table.ppl_rows(rows), table.bucket_rows(rows), table.passkey_rows(rows)
    written = [os.path.join(workdir, f) for f in ("report.md", "ppl.csv", "buckets.csv",
                                                   "passkey.csv")]
    for path, part, columns in zip(written[1:], (ppl, buckets, passkey),
                                   (table.PPL_COLUMNS, table.BUCKET_COLUMNS,
                                    table.PASSKEY_COLUMNS)):
        write_text(path, csv_text(part, columns))
    texts = list(plan.settings.texts)
    devices = f"{jax.devices()[0].platform} x{len(jax.devices())}"
    md = ["# Zero-shot context extension of pretrained models", "",
          ("`python -m train.extend --config=<config> --workdir=<dir>` "
          f"({len(plan.jobs)} jobs; {devices}). Perplexity: one forward over the first n + 1 "
          "tokens of text that ships with Python (prose: `pydoc_data/topics.py`; code: long "
          "stdlib modules), the loss at every position. Passkey: the YaRN / LongRoPE prompt, "
          "exact match of the first number decoded."), ""]
    for model in plan.models:
        md += _model_section(plan, model, ppl, buckets, passkey)
        figures.position_figure(os.path.join(workdir, f"ppl_by_position_{model}.png"),
                                buckets, model=model, context=plan.contexts[model],
                                methods=plan.methods, texts=texts)
        figures.passkey_figure(os.path.join(workdir, f"passkey_{model}.png"), passkey,
                               model=model, context=plan.contexts[model],
                               methods=plan.methods)
    md += _scaling_notes(plan, results) + _timing(plan, results, timings)
    write_text(written[0], "\n".join(md))
    return written
