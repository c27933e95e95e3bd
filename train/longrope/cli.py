"""The command: search LongRoPE factors for a pretrained checkpoint on the user's text.

    python -m train.longrope --checkpoint=SmolLM2.gguf --target_length=16384 \
        --text=book.txt --workdir=runs/longrope [--generations=40 --population=64 --seed=0 ...]

Prints the cost estimate (one timed evaluation times the evaluations) before the search, one
line per generation, then writes DIR/result.json (the longrope dict, the start count, the
perplexity, and the seeds' perplexities: PI, NTK, YaRN) and, when the start count is 0,
DIR/rope_scaling.json: the dict `posenc_jax.pretrained.load(..., rope_scaling=...)` and
transformers (after `pretrained.save`) read. A start count > 0 has no transformers key: the
command says so and writes no rope_scaling.json (`--starts=0` keeps it at 0). With
`--short_factor` a second search (`train.longrope.short`) then finds the factors for lengths
within the original context (DIR/short; otherwise short_factor is ones). Rerunning the same
command resumes the search(es) in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from train.longrope import export
from train.longrope.fitness import Perplexity
from train.longrope.progress import write_json
from train.longrope.search import SearchConfig, estimate, search
from train.longrope.short import ShortFactors

__all__ = ["main", "parser", "run"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m train.longrope", description=__doc__.split(
        "\n")[0])
    p.add_argument("--checkpoint", required=True, help="a Hugging Face directory or a GGUF file")
    p.add_argument("--target_length", type=int, required=True, help="the context to reach")
    p.add_argument("--text", required=True, help="a text file, or a directory of them")
    p.add_argument("--workdir", required=True, help="state, log.jsonl, tensorboard/, results")
    defaults = SearchConfig()
    for key in ("generations", "population", "parents", "mutations", "crossovers", "seed"):
        p.add_argument(f"--{key}", type=int, default=getattr(defaults, key))
    p.add_argument("--rate", type=float, default=defaults.rate, help="mutation probability")
    p.add_argument("--samples", type=int, default=1, help="windows of target_length tokens")
    p.add_argument("--starts", default=None, help="allowed start counts, a comma list (default:"
                   " the paper's below the original length); 0 alone keeps the result exportable")
    p.add_argument("--step", type=float, default=0.01, help="the factors' grid")
    p.add_argument("--max_ratio", type=float, default=1.25, help="upper bound / target scale")
    p.add_argument("--attention", default="dense", help="the attention backend (one that "
                   "calls the rotate hook when starts > 0: dense or blockwise)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--short_factor", action="store_true", help="then search short_factor "
                   "(the paper's second search, within the original context: windows of the "
                   "original length cut from the same text; in WORKDIR/short)")
    return p


def run(args: argparse.Namespace, *, out=sys.stdout) -> dict:
    """The search of `args` (see `parser`); returns what result.json holds."""
    try:
        starts = None if args.starts is None else tuple(
            int(s) for s in str(args.starts).split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--starts must be a comma list of ints, got --starts={args.starts!r}"
                         ) from None
    config = SearchConfig(**{k: getattr(args, k) for k in (
        "generations", "population", "parents", "mutations", "crossovers", "seed", "rate")})
    fit = Perplexity.load(args.checkpoint, target_length=args.target_length, text=args.text,
                          samples=args.samples, attention=args.attention, dtype=args.dtype,
                          step=args.step)
    space = fit.space(starts=starts, max_ratio=args.max_ratio)
    seeds = fit.seeds(space)
    cost, value = estimate(fit, seeds[0], config)
    print(f"longrope search: R={space.pairs} pairs, scale {space.scale:g} "
          f"({fit.original} -> {fit.target_length}), {fit.tokens.shape[0]} window(s); {cost}",
          file=out, flush=True)

    def progress(record):
        print(f"generation {record['generation']}: best ppl {record['best_ppl']:.4f} "
              f"(this generation {record['generation_best_ppl']:.4f}), "
              f"{record['evaluations']} evaluations, {record['seconds']:.1f} s", file=out,
              flush=True)

    result = search(fit, space, config, seeds=seeds, workdir=args.workdir,
                    known={seeds[0]: value}, on_generation=progress)
    values = {c: result.values[c] if c in result.values else fit(c) for c in seeds}
    short_factor, short = None, {}
    if args.short_factor:
        short_fit = ShortFactors.after(fit, result.best)
        short_space = short_fit.space(max_ratio=args.max_ratio)
        print(f"short_factor search: {short_fit.tokens.shape[0]} window(s) of "
              f"{short_fit.target_length}", file=out, flush=True)
        short_seeds = short_fit.seeds(short_space)
        found = search(short_fit, short_space, config, seeds=short_seeds,
                       workdir=os.path.join(args.workdir, "short"), on_generation=progress)
        short_factor = list(found.best.factors(short_space.step))
        short = {"short_perplexity": found.value,
                 "short_seeds": {name: found.values[c] for name, c in zip(
                     ("ones", "long_factor"), short_seeds)}}
    summary = {"rope_scaling": export.scaling_dict(
                   result.best, step=space.step, target_length=fit.target_length,
                   original_max_position_embeddings=fit.original, short_factor=short_factor),
               **short,
               "unscaled_start": result.best.start, "perplexity": result.value,
               "seeds": {name: values[c] for name, c in zip(("pi", "ntk", "yarn"), seeds)},
               "estimate": vars(cost), "checkpoint": str(args.checkpoint),
               "target_length": fit.target_length}
    write_json(os.path.join(args.workdir, "result.json"), summary)
    try:
        scaling = export.rope_scaling(result.best, step=space.step, target_length=fit.target_length,
                                      original_max_position_embeddings=fit.original,
                                      short_factor=short_factor)
    except ValueError as error:
        print(f"no rope_scaling.json: {error}", file=out)
    else:
        write_json(os.path.join(args.workdir, "rope_scaling.json"), scaling)
        print(f"wrote {os.path.join(args.workdir, 'rope_scaling.json')}", file=out)
    print(f"best perplexity {result.value:.4f} (start {result.best.start}); seeds: "
          + json.dumps(summary["seeds"]), file=out)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    run(parser().parse_args(argv))
    return 0
