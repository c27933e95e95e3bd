"""The README's section on context extension, written from a finished run's files.

    python -m train.extend.readme docs/extend [--link=docs/extend]   prints the section

It reads <dir>/ppl.csv, buckets.csv, passkey.csv and timings.json (what `train.extend`
wrote there) and prints Markdown: per model, one row per method with its factor at the
longest length, perplexity at C and at the longest length, the last position bucket's
perplexity, and the supported lengths of `table.supported` (the report's criterion); then
the figures and the fine-tuned row. Links point at `--link` (default: the directory as
given). Without results it prints the "not yet measured" table with the command. Pure
reading: it writes nothing.
"""

from __future__ import annotations

import csv
import math
import os
import sys
from collections.abc import Sequence

from train.engine.scalings import NO_SCALING
from train.engine.store import TIMINGS, read_timings
from train.extend import table
from train.extend.report import FINETUNE_COMMAND

COMMAND = "python -m train.extend --config=configs/extend_smollm2.py --workdir=docs/extend"
TOLERANCE, THRESHOLD = 0.10, 0.9


def _rows(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _len(n: int | None, context: int) -> str:
    if n is None:
        return "not measured"
    return "none" if n == 0 else f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _pos(n: int) -> str:
    return f"{n // 1024}k" if n and n % 1024 == 0 else str(n)


def _num(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.2f}"


def placeholder() -> str:
    return "\n".join([
        "| model | method | perplexity within 10% up to | passkey >= 0.9 up to |",
        "|---|---|---|---|",
        ("| SmolLM2-135M (C = 8192) | none, linear, ntk, dynamic, yarn | not yet measured "
        f"(`{COMMAND}`) | not yet measured |"),
        ("| Gemma 3 270M (C = 32768) | all | not yet measured (`configs/extend_full.py`, "
        "accelerator) | not yet measured |"),
        (f"| SmolLM2-135M, YaRN x4 fine-tuned at 32k | yarn | not yet measured "
        f"(`{FINETUNE_COMMAND}`) | not yet measured |")])


def model_table(ppl, buckets, passkey, *, model: str) -> list[str]:
    """The rows of one model (prose text, the study's criterion)."""
    context = int(next(r["context"] for r in ppl if r["model"] == model))
    texts = sorted({r["text"] for r in ppl if r["model"] == model})
    text = "prose" if "prose" in texts else texts[0]
    methods = list(dict.fromkeys(r["method"] for r in ppl if r["model"] == model))
    longest = max(int(r["length"]) for r in ppl if r["model"] == model)
    pk_max = max((int(r["length"]) for r in passkey if r["model"] == model), default=0)
    sup = {s["method"]: s for s in table.supported(
        ppl, passkey, model=model, methods=methods, context=context, texts=texts,
        tolerance=TOLERANCE, threshold=THRESHOLD)}
    last = {r["method"]: float(r["ppl"]) for r in buckets if r["model"] == model
            and r["text"] == text and int(r["length"]) == longest and int(r["end"]) == longest}
    edge = next((int(r["start"]) for r in buckets if r["model"] == model
                 and int(r["end"]) == longest), context)
    out = [(f"| method | factor at {_len(longest, context)} | ppl at C ({_len(context, context)})"
           f" | ppl at {_len(longest, context)} | ppl of positions [{_pos(edge)}, "
           f"{_pos(longest)}) | ppl within 10% up to | passkey >= 0.9 up to |"),
           "|---|---|---|---|---|---|---|"]
    for m in methods:
        c = table.curve(ppl, model=model, method=m, key="ppl", text=text)
        factor = 1.0 if m == NO_SCALING else longest / context
        pk = _len(sup[m]["passkey_len"], context)
        if sup[m]["passkey_len"] and sup[m]["passkey_len"] == pk_max < longest:
            pk += " (longest measured)"
        out.append(f"| {m} | {factor:g} | {_num(c.get(context))} | {_num(c.get(longest))} | "
                   f"{_num(last.get(m))} | {_len(sup[m]['ppl_len'], context)} | {pk} |")
    return out


def section(directory: str, *, link: str | None = None) -> str:
    """The README section's Markdown from the files in `directory`."""
    link = (link or directory).rstrip("/")
    ppl = _rows(os.path.join(directory, "ppl.csv"))
    head = ["### Context extension of pretrained models, zero-shot", ""]
    if not ppl:
        return "\n".join(head + [f"Not yet measured: `{COMMAND}`.", "", placeholder(), ""])
    buckets = _rows(os.path.join(directory, "buckets.csv"))
    passkey = _rows(os.path.join(directory, "passkey.csv"))
    timings = read_timings(os.path.join(directory, TIMINGS))
    wall = sum(float(t.get("wall_s", 0.0)) for t in timings) / 60
    est = next((t["estimate_s"] / 60 for t in timings if t.get("estimate_s")), None)
    out = head + [
        (f"`{COMMAND}` ({wall:.0f} min in {len(timings)} invocation(s); estimated "
        f"{'?' if est is None else f'{est:.0f}'} min before the first): perplexity of the "
        "Python documentation's prose (`pydoc_data/topics.py`) by position and passkey "
        "retrieval, each method at factor = length / C. Supported length: perplexity within "
        "10% of the model's own at C, passkey accuracy >= 0.9. Full tables: "
        f"[{link}/report.md]({link}/report.md), CSVs in [{link}/]({link}/)."), ""]
    for model in dict.fromkeys(r["model"] for r in ppl):
        context = int(next(r["context"] for r in ppl if r["model"] == model))
        out += [f"**{model}** (C = {context}):", ""]
        out += model_table(ppl, buckets, passkey, model=model) + [""]
        out += [f"![perplexity by position]({link}/ppl_by_position_{model}.png)",
                f"![passkey accuracy]({link}/passkey_{model}.png)", ""]
    out += [(f"YaRN x4 fine-tuned at 32k: not yet measured (`{FINETUNE_COMMAND}`). Gemma 3 270M "
            "(C = 32768): not yet measured (`configs/extend_full.py`, accelerator)."), ""]
    return "\n".join(out)


def main(argv: Sequence[str]) -> int:
    args = [a for a in argv if not a.startswith("--link=")]
    links = [a.split("=", 1)[1] for a in argv if a.startswith("--link=")]
    if len(args) != 1:
        print("usage: python -m train.extend.readme DIR [--link=PATH]", file=sys.stderr)
        return 2
    print(section(args[0], link=links[0] if links else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
