"""What LongRoPE's fitness evaluations cost here, for a checkpoint or a study-shaped model.

    python scripts/longrope_cost.py --checkpoint=PATH --target_length=N --text=FILE \
        [--candidates=8] [--attention=dense] [--no_scan]
    python scripts/longrope_cost.py --study --target_length=512 [--candidates=8]

Times `fit(candidate)` for `candidates` distinct candidates (the PI / NTK / YaRN seeds, then
more on the grid, starts 0 and the smallest start > 0 alternating): the first evaluation (it
compiles), the mean of the others, and the paper's generation at that rate (32 evaluations:
16 mutations + 16 crossovers). Only the public `Perplexity` API is used, so the same script
measures any version of the fitness (docs/longrope.md has the figures before and after the
factors became runtime inputs). `--study`: configs/study.py's model (random weights, trained
length L = 64) on random bytes, 2048 // target_length windows, as `train.study.searched` runs
it. Prints one JSON line.
"""

import argparse
import json
import time

import jax
import numpy as np

from configs import study
from train import state as state_lib
from train.longrope.fitness import Perplexity
from train.longrope.space import Candidate


def _fitness(args) -> tuple[Perplexity, float]:
    t0 = time.perf_counter()
    if args.study:
        train = study.get_config().train
        model = state_lib.build_model(state_lib.transformer_config(train.model), seed=0)
        samples = max(1, 2048 // args.target_length)
        tokens = np.random.default_rng(0).integers(0, train.model.vocab_size, (
            samples, args.target_length)).astype(np.int32)
        fit = Perplexity.of_model(model, tokens, original=train.seq_len, scan_layers=False)
    else:
        fit = Perplexity.load(args.checkpoint, target_length=args.target_length, text=args.text,
                              attention=args.attention, scan_layers=not args.no_scan)
    return fit, time.perf_counter() - t0


def _candidates(fit: Perplexity, count: int) -> list[Candidate]:
    space = fit.space()
    out = list(fit.seeds(space))
    starts = [n for n in space.starts if n > 0][:1] or [0]
    k = 0
    while len(out) < count:
        steps = tuple(int(v) for v in np.linspace(space.low, space.high - k, space.pairs))
        cand = Candidate(steps, starts[0] if len(out) % 2 else 0)
        if cand not in out:
            out.append(cand)
        k += 1
    return out[:count]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint")
    p.add_argument("--text")
    p.add_argument("--study", action="store_true")
    p.add_argument("--target_length", type=int, required=True)
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--attention", default="dense")
    p.add_argument("--no_scan", action="store_true")
    args = p.parse_args()
    fit, load = _fitness(args)
    seconds = []
    for cand in _candidates(fit, args.candidates):
        t0 = time.perf_counter()
        fit(cand)
        seconds.append(time.perf_counter() - t0)
    rest = seconds[1:] or seconds
    print(json.dumps({
        "model": "study" if args.study else args.checkpoint, "target_length": fit.target_length,
        "windows": int(fit.tokens.shape[0]), "backend": jax.default_backend(),
        "load_s": round(load, 2), "first_s": round(seconds[0], 3),
        "per_evaluation_s": round(float(np.mean(rest)), 3),
        "all_s": [round(s, 3) for s in seconds],
        "generation_s": round(32 * float(np.mean(rest)), 1)}))


if __name__ == "__main__":
    main()
