"""Writes tests/data/pretrained/longrope/: transformers' logits of the tiny Llama exported with
LongRoPE factors our search found.

Run in the throwaway golden venv (torch + transformers, /work/goldenvenv), from the repository
root:

    /work/goldenvenv/bin/python scripts/make_longrope_golden.py [--python PROJECT_PYTHON]

It runs scripts/longrope_export_case.py with the project's Python (search, then
`pretrained.save`), loads the exported directory with `AutoModelForCausalLM.from_pretrained` --
nothing but the files we wrote -- and records golden.npz (`logits` [1, 128, V] float32) and
golden.json (the rope_scaling, the token ids, the sha256 of every file transformers read, the
class it built, the versions). tests/train/test_longrope_golden.py exports again without torch,
checks the sha256 and compares our logits.
"""

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import tempfile

import numpy as np
import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "pretrained" / "longrope"


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--python", default="/work/main/.venv/bin/python")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
        subprocess.run([args.python, str(ROOT / "scripts" / "longrope_export_case.py"), tmp],
                       check=True, env=env, cwd=ROOT)
        cases = json.loads(pathlib.Path(tmp, "case.json").read_text())
        arrays, meta = {}, {}
        for name, case in cases.items():
            model_dir = pathlib.Path(tmp, name)
            files = sorted(q for q in model_dir.iterdir()
                           if q.name == "config.json" or q.name.startswith("model"))
            model = transformers.AutoModelForCausalLM.from_pretrained(model_dir,
                                                                      dtype=torch.float32)
            model.eval()
            with torch.no_grad():
                arrays[name] = model(torch.tensor([case["tokens"]])).logits.numpy().astype(
                    np.float32)
            meta[name] = {"rope_scaling": case["rope_scaling"], "tokens": case["tokens"],
                          "sha256": {q.name: sha256(q) for q in files},
                          "class": type(model).__name__,
                          "rope": dict(model.config.rope_parameters)}
        OUT.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(OUT / "golden.npz", **arrays)
        (OUT / "golden.json").write_text(json.dumps({"cases": meta, "versions": {
            "torch": torch.__version__, "transformers": transformers.__version__}},
            indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
