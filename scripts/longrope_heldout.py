"""The factors of docs/longrope_search.json on text the search did not see.

    python scripts/longrope_heldout.py --checkpoint=W/hf --figure=docs/longrope_search

The search fitted its factors on the first `samples` windows of pydoc_data/topics.py; this
scores every set of factors in FIGURE.json (searched, searched with start 0, PI, NTK, YaRN,
unscaled RoPE) on the next `windows` windows of the same file, read as bytes, and writes
FIGURE_heldout.json.
"""

import argparse
import json
import pathlib
import sysconfig

import numpy as np

from posenc_jax import pretrained
from train.longrope.fitness import Perplexity, windows
from train.longrope.space import Candidate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--figure", required=True)
    p.add_argument("--skip", type=int, default=4, help="windows the search saw")
    p.add_argument("--windows", type=int, default=8)
    args = p.parse_args()
    fig = json.loads(pathlib.Path(args.figure + ".json").read_text())
    length = fig["target_length"]
    path = pathlib.Path(sysconfig.get_paths()["stdlib"], "pydoc_data", "topics.py")
    data = np.frombuffer(path.read_bytes(), np.uint8).astype(np.int32)
    rows = windows(data, target_length=length, samples=args.skip + args.windows)[args.skip:]
    fit = Perplexity.pretrained(pretrained.load(args.checkpoint), rows, where=args.checkpoint)
    space = fit.space()
    sets = {"searched": fig["searched"], "searched_start_0": fig["searched_start_0"],
            **fig["seeds"], "all ones": {"long_factor": [1.0] * fit.pairs}}
    out = {}
    for name, entry in sets.items():
        cand = Candidate(space.to_steps(entry["long_factor"]), entry.get("start", 0))
        out[name] = {"fitted_ppl": entry.get("ppl", fig.get("all_ones_ppl")),
                     "heldout_ppl": fit(cand)}
        print(name, out[name], flush=True)
    pathlib.Path(args.figure + "_heldout.json").write_text(json.dumps(
        {"windows": args.windows, "skip": args.skip, "target_length": length, "ppl": out},
        indent=1) + "\n")


if __name__ == "__main__":
    main()
