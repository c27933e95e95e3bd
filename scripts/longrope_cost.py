"""What one LongRoPE fitness evaluation costs here: load, compile and run, for a checkpoint.

    python scripts/longrope_cost.py --checkpoint=PATH --target_length=N --text=FILE \
        [--attention=dense] [--no_scan] [--compile_only]

Prints one JSON line: seconds to load the checkpoint, to compile one candidate's loss (every
candidate compiles once: its factors are static), to run it on one window, and the per
generation cost of the paper's search (32 evaluations: 16 mutations + 16 crossovers).
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp

from train.longrope.fitness import Perplexity


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--target_length", type=int, required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--attention", default="dense")
    p.add_argument("--no_scan", action="store_true")
    p.add_argument("--compile_only", action="store_true")
    args = p.parse_args()
    t0 = time.perf_counter()
    fit = Perplexity.load(args.checkpoint, target_length=args.target_length, text=args.text,
                          attention=args.attention, scan_layers=not args.no_scan)
    load = time.perf_counter() - t0
    cand = fit.seeds(fit.space(starts=(0,)))[1]  # the NTK rule
    tokens = jnp.asarray(fit.tokens[:1])
    t0 = time.perf_counter()
    compiled = fit.window_loss(cand).lower(fit.state, tokens).compile()
    compile_s = time.perf_counter() - t0
    out = {"checkpoint": args.checkpoint, "target_length": args.target_length,
           "attention": args.attention, "scan_layers": not args.no_scan,
           "load_s": round(load, 2), "compile_s": round(compile_s, 2),
           "backend": jax.default_backend()}
    if not args.compile_only:
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(fit.state, tokens))
        out["run_s"] = round(time.perf_counter() - t0, 2)
        out["generation_s"] = round(32 * (compile_s + out["run_s"]), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
