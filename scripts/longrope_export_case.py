"""The LongRoPE export case: search factors for the tiny Llama, export the model with them.

    python scripts/longrope_export_case.py OUT_DIR        (the project's Python: jax, no torch)

Runs the `train.longrope` command on tests/data/pretrained/tiny/llama (target 128 = 2x its
context, the README as text, seed 0, a short search with the start count kept at 0), loads the
checkpoint with the found `rope_scaling` and writes it with `pretrained.save` to
OUT_DIR/searched; the same with the search's NTK-rule seed (non-uniform factors; a random tiny
model's search may well end at PI's uniform ones) to OUT_DIR/ntk_seed; and OUT_DIR/case.json:
per case the rope_scaling and 128 token ids (the long regime: > 64 positions).
scripts/make_longrope_golden.py runs this, then transformers on each directory.
"""

import json
import os
import pathlib
import sys

from posenc_jax import pretrained
from train.longrope import cli, export
from train.longrope.fitness import Perplexity

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "pretrained" / "tiny" / "llama"
TARGET = 128


def main(out: str) -> None:
    work = os.path.join(out, "search")
    argv = [f"--checkpoint={TINY}", f"--target_length={TARGET}", f"--text={ROOT / 'README.md'}",
            f"--workdir={work}", "--generations=2", "--population=6", "--parents=3",
            "--mutations=2", "--crossovers=2", "--starts=0", "--seed=0"]
    cli.main(argv)
    found = json.loads(pathlib.Path(work, "rope_scaling.json").read_text())
    fit = Perplexity.load(TINY, target_length=TARGET, text=str(ROOT / "README.md"))
    space = fit.space(starts=(0,))
    ntk = export.rope_scaling(fit.seeds(space)[1], step=space.step, target_length=TARGET,
                              original_max_position_embeddings=fit.original)
    cases = {}
    for name, scaling in (("searched", found), ("ntk_seed", ntk)):
        lm = pretrained.load(TINY, rope_scaling=scaling)
        pretrained.save(lm, os.path.join(out, name))
        tokens = lm.tokenizer.encode((ROOT / "README.md").read_text())[:TARGET]
        cases[name] = {"rope_scaling": scaling, "tokens": tokens}
    pathlib.Path(out, "case.json").write_text(json.dumps(cases, indent=1))

if __name__ == "__main__":
    main(sys.argv[1])
