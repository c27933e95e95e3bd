"""The extension study's measures as eval hooks of a fine-tune (`config.eval.extension`).

    out = measures(model, tokenizer, stream, spec)     # {"extend/ppl/0-2048": ..., ...}
    write_report(workdir, before, after, spec)         # extension_report.{json,md}

Measures (`train.extend.measure`, the study's own functions):
  perplexity by position bucket  -log p of each position of the first `length` + 1 tokens of
                   the held-out stream, averaged in the study's buckets [0, C/4), [C/4, C/2),
                   [C/2, C), [C, 2C), ... where C is the checkpoint's original context
                   (`extend/ppl/<start>-<end>`), and over all positions (`extend/ppl`);
  passkey          greedy retrieval of a `digits`-digit key hidden at each depth in a prompt
                   of each of `passkey_lengths` tokens (`extend/passkey/<length>`: accuracy).

The trainer logs them with every evaluation (metrics.jsonl and TensorBoard), measures the
starting model once before the first step (kept in `extension_before.json`, so a resumed run
keeps it) and, at the end, writes the before / after report in the study's format.

Config block `eval.extension`: enabled, length (0: the run's seq_len), context (0: the
checkpoint's original context, else seq_len), passkey_lengths (tuple), passkey_depths,
passkey_digits, passkey_seed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from posenc_jax import checks
from train.extend import measure, prompts, texts

BEFORE = "extension_before.json"
REPORT = "extension_report"


@dataclasses.dataclass(frozen=True)
class Spec:
    length: int
    context: int
    passkey_lengths: tuple[int, ...] = ()
    passkey_depths: tuple[float, ...] = (0.5,)
    digits: int = 5
    seed: int = 0


def spec_of(config, *, context: int | None) -> Spec | None:
    """The `Spec` of `config.eval.extension` (None when absent or disabled); `context`: the
    checkpoint's original context length, if known."""
    block = config.eval.get("extension")
    if block is None or not checks.boolean("config.eval.extension.enabled",
                                           block.get("enabled", False)):
        return None
    length = checks.integer("config.eval.extension.length", block.get("length", 0), minimum=0)
    ctx = checks.integer("config.eval.extension.context", block.get("context", 0), minimum=0)
    lengths = tuple(checks.positive_int(f"config.eval.extension.passkey_lengths[{i}]", n)
                    for i, n in enumerate(block.get("passkey_lengths", ())))
    depths = tuple(checks.finite_float(f"config.eval.extension.passkey_depths[{i}]", d,
                                       minimum=0.0, maximum=1.0)
                   for i, d in enumerate(block.get("passkey_depths", (0.5,))))
    return Spec(length=length or int(config.seq_len),
                context=ctx or int(context or config.seq_len), passkey_lengths=lengths,
                passkey_depths=depths,
                digits=checks.positive_int("config.eval.extension.passkey_digits",
                                           block.get("passkey_digits", 5)),
                seed=checks.integer("config.eval.extension.passkey_seed",
                                    block.get("passkey_seed", 0), minimum=0))


def measures(model, tokenizer, stream, spec: Spec) -> dict[str, float]:
    """The measures of the module docstring for an NNX model (float values)."""
    if len(stream) < spec.length + 1:
        raise ValueError(f"config.eval.extension.length={spec.length}: the held-out stream "
                         f"has only {len(stream)} tokens")
    nll = measure.position_nll(model, stream.tokens[:spec.length + 1].astype(np.int32))
    out = {f"extend/ppl/{a}-{b}": p
           for a, b, p in measure.bucket_perplexity(nll, context=spec.context)}
    out["extend/ppl"] = measure.perplexity(nll)
    keys = prompts.make_keys(1, digits=spec.digits, seed=spec.seed)
    for length in spec.passkey_lengths:
        items = [prompts.passkey_prompt(lambda t: texts.plain_ids(tokenizer, t), length=length,
                                        depth=d, key=k)
                 for d in spec.passkey_depths for k in keys]
        answers = measure.passkey_answers(model, [p.ids for p in items],
                                          decode=tokenizer.decode,
                                          max_new_tokens=spec.digits + 3)
        out[f"extend/passkey/{length}"] = float(np.mean(
            [prompts.answer_matches(a, p.key) for a, p in zip(answers, items)]))
    return out


def load_before(workdir: str) -> dict[str, float] | None:
    path = os.path.join(workdir, BEFORE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def save_before(workdir: str, values: dict[str, float]) -> None:
    tmp = os.path.join(workdir, BEFORE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(values, f, indent=1)
    os.replace(tmp, os.path.join(workdir, BEFORE))


def markdown(before: dict[str, Any], after: dict[str, Any], spec: Spec, *, title: str) -> str:
    """The before / after table: one row per measure (bucket perplexities, passkey)."""
    lines = [f"# {title}", "",
             f"Perplexity by position bucket over the first {spec.length} held-out tokens "
             f"(C = {spec.context}); passkey accuracy by prompt length.", "",
             "| measure | before | after |", "|---|---|---|"]
    for key in sorted(after, key=lambda k: (k.count("/"), k)):
        b = before.get(key)
        lines.append(f"| {key} | {'' if b is None else f'{b:.4g}'} | {after[key]:.4g} |")
    return "\n".join(lines) + "\n"


def write_report(workdir: str, before: dict[str, Any] | None, after: dict[str, Any], spec: Spec,
                 *, title: str) -> list[str]:
    """extension_report.json and .md in `workdir`; returns their paths."""
    before = before or {}
    paths = [os.path.join(workdir, REPORT + ext) for ext in (".json", ".md")]
    with open(paths[0], "w") as f:
        json.dump({"before": before, "after": after, "spec": dataclasses.asdict(spec)}, f,
                  indent=1)
    with open(paths[1], "w") as f:
        f.write(markdown(before, after, spec, title=title))
    return paths
