"""The figure and numbers of docs/longrope_search.md: LongRoPE's search on a small model.

    python -m train --config=configs/rope.py --workdir=W --config.seq_len=64 ...   # train
    python -m train.export --workdir=W --out=W/hf                                  # export
    python scripts/longrope_figure.py --checkpoint=W/hf --target_length=256 \
        --workdir=W/search --out=docs/longrope_search

The model trained here reads bytes (vocab 256) and its export has no tokenizer, so the text
(the Python documentation's prose, `pydoc_data/topics.py`) is read as bytes here. Writes
OUT.png (the searched factors beside the NTK rule s^(2i/(d-2)), PI and YaRN) and OUT.json
(the factors, the start count, and the perplexities at the target length).
"""

import argparse
import json
import os
import pathlib
import sysconfig

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from posenc_jax import pretrained
from train.longrope.fitness import Perplexity, windows
from train.longrope.search import SearchConfig, estimate, search
from train.longrope.space import Candidate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--target_length", type=int, required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--generations", type=int, default=10)
    p.add_argument("--population", type=int, default=32)
    p.add_argument("--parents", type=int, default=16)
    p.add_argument("--mutations", type=int, default=8)
    p.add_argument("--crossovers", type=int, default=8)
    args = p.parse_args()
    lm = pretrained.load(args.checkpoint)
    path = os.path.join(sysconfig.get_paths()["stdlib"], "pydoc_data", "topics.py")
    data = np.frombuffer(pathlib.Path(path).read_bytes(), np.uint8).astype(np.int32)
    fit = Perplexity.pretrained(lm, windows(data, target_length=args.target_length, samples=args.samples),
                     where=args.checkpoint)
    space = fit.space()  # the paper's starts below the original length
    seeds = fit.seeds(space)
    config = SearchConfig(generations=args.generations, population=args.population,
                          parents=args.parents, mutations=args.mutations,
                          crossovers=args.crossovers)
    cost, value = estimate(fit, seeds[0], config)
    print(cost, flush=True)
    result = search(fit, space, config, seeds=seeds, workdir=args.workdir,
                    known={seeds[0]: value}, on_generation=lambda r: print(r, flush=True))
    best0 = min((c for c in result.values if c.start == 0), key=result.values.get)
    names = ("PI", "NTK rule", "YaRN")
    out = {"target_length": fit.target_length, "original": fit.original,
           "scale": fit.scale, "pairs": fit.pairs, "estimate": vars(cost),
           "seconds": sum(r["seconds"] for r in result.records),
           "searched": {"long_factor": list(result.best.factors(space.step)),
                        "start": result.best.start, "ppl": result.value},
           "searched_start_0": {"long_factor": list(best0.factors(space.step)),
                                "ppl": result.values[best0]},
           "seeds": {n: {"long_factor": list(c.factors(space.step)),
                         "ppl": result.values[c]} for n, c in zip(names, seeds)},
           "all_ones_ppl": fit(Candidate((space.low,) * space.pairs, 0))}
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    i = np.arange(fit.pairs)
    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, entry), style in zip(out["seeds"].items(), (":", "--", "-.")):
        ax.plot(i, entry["long_factor"], style, label=f"{name} (ppl {entry['ppl']:.3f})")
    ax.plot(i, out["searched"]["long_factor"], "o-", label=(
        f"searched, start {result.best.start} (ppl {result.value:.3f})"))
    if result.best.start:
        ax.plot(i, out["searched_start_0"]["long_factor"], "s-", ms=3, label=(
            f"searched, start 0 (ppl {out['searched_start_0']['ppl']:.3f})"))
    ax.set_xlabel("rotary pair i (high -> low frequency)")
    ax.set_ylabel("rescale factor lambda_i")
    ax.set_title(f"LongRoPE search, {fit.original} -> {fit.target_length} "
                 f"(s = {fit.scale:g}), d = {2 * fit.pairs}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)
    print(json.dumps(out["searched"]), flush=True)


if __name__ == "__main__":
    main()
