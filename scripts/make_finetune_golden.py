"""Writes tests/data/pretrained/finetune/: transformers' logits of a fine-tuned SmolLM2 export.

Run in the throwaway golden venv (torch + transformers 5.24: /work/goldenvenv), from the
repository root:

    /work/goldenvenv/bin/python scripts/make_finetune_golden.py --python /work/main/.venv/bin/python

It runs scripts/finetune_golden_run.py's fine-tune (`python -m train` with
configs/extend_finetune.py on SmolLM2 with YaRN x2, two LoRA steps at 256 tokens) and its
export (`python -m train.export`) with the project's Python, then loads the export with
`AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32)` and records:

    golden.npz   logits [1, N, 1024] (the first 1,024 vocab columns), max [1, N] and
                 argmax [1, N] over the whole vocabulary, for N = 320 fixed token ids
    golden.json  the export's config.json, the run's losses, the versions

tests/train/test_finetune_smollm2.py runs the same fine-tune and export and compares its
loaded export's logits with these.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import tempfile

import numpy as np
import torch
import transformers

import finetune_golden_run as run

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "pretrained" / "finetune"
COLUMNS = 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir, export = f"{tmp}/run", f"{tmp}/hf"
        env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
               **{k: v for k, v in os.environ.items() if k.startswith(
                   ("POSENC_", "PATH", "HOME", "JAX_COMPILATION"))}}
        subprocess.run(run.train_command(args.python, workdir, f"{tmp}/data"), cwd=ROOT,
                       env=env, check=True)
        subprocess.run(run.export_command(args.python, workdir, export), cwd=ROOT, env=env,
                       check=True)
        losses = [json.loads(x)["loss"] for x in
                  pathlib.Path(workdir, "metrics.jsonl").read_text().splitlines() if x.strip()]
        model = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
        config = json.loads(pathlib.Path(export, "config.json").read_text())
        ids = run.token_ids(config["vocab_size"])
        with torch.no_grad():
            logits = model(torch.as_tensor(ids)).logits.numpy()
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "golden.npz", logits=logits[..., :COLUMNS].astype(np.float32),
                        max=logits.max(-1), argmax=logits.argmax(-1))
    (OUT / "golden.json").write_text(json.dumps(
        {"config": config, "losses": losses, "class": type(model).__name__,
         "versions": {"torch": torch.__version__, "transformers": transformers.__version__}},
        indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}: losses {losses}, {type(model).__name__}")


if __name__ == "__main__":
    main()
