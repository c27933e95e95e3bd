"""Writes tests/data/pretrained/export/: transformers' logits of what `pretrained.save` wrote.

Run in the throwaway golden venv (torch + transformers; /work/goldenvenv, see
scripts/make_pretrained_golden.py), from the repository root:

    /work/goldenvenv/bin/python scripts/make_export_golden.py [--python .venv/bin/python] [CASE ...]

Named cases are (re)recorded and the golden's other cases kept; none: every case, afresh.

It first runs scripts/export_cases.py with the project's Python (`--python`, which has jax),
exporting every case into a temporary directory; then, for each, loads the directory with
`AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32)` -- nothing but the files we
wrote -- and records, for the case's tokens:

    golden.npz   <case>__logits [1, L, min(V, 1024)] float32 (the first 1,024 vocab columns),
                 <case>__argmax [1, L] and <case>__max [1, L] over the whole vocabulary
    golden.json  per case: the class transformers built, the token ids, the sha256 of every
                 file it read (config.json, *.safetensors, the index), and the versions

tests/pretrained/test_pretrained_export_golden.py exports the cases again (no torch), checks the files'
sha256 (so the comparison is with what transformers actually loaded) and our logits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "pretrained" / "export"
COLUMNS = 1024


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """The files transformers reads from an export (tokens.json is ours)."""
    return sorted(p for p in directory.iterdir()
                  if p.name == "config.json" or p.name.startswith("model"))


def record(directory: pathlib.Path, arrays: dict, name: str) -> dict:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    tokens = json.loads((directory / "tokens.json").read_text())
    with torch.no_grad():
        logits = model(torch.tensor(tokens, dtype=torch.long)).logits.float().numpy()
    arrays[f"{name}__logits"] = logits[..., :COLUMNS].astype(np.float32)
    arrays[f"{name}__argmax"] = logits.argmax(-1).astype(np.int32)
    arrays[f"{name}__max"] = logits.max(-1).astype(np.float32)
    return {"class": type(model).__name__, "tokens": tokens,
            "files": {p.name: _sha256(p) for p in checkpoint_files(directory)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"),
                        help="the project's Python (with jax) that runs export_cases.py")
    parser.add_argument("cases", nargs="*", help="default: every case of export_cases.py")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    arrays: dict = {}
    table: dict = {"versions": {"transformers": transformers.__version__,
                                "torch": torch.__version__}, "cases": {}}
    if args.cases and (OUT / "golden.json").is_file():  # named cases: the others are kept
        arrays = dict(np.load(OUT / "golden.npz"))
        table["cases"] = json.loads((OUT / "golden.json").read_text())["cases"]
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's posenc_jax
        subprocess.run([args.python, str(ROOT / "scripts" / "export_cases.py"), work,
                        *args.cases], check=True, cwd=ROOT, env=env)
        for directory in sorted(pathlib.Path(work).iterdir()):
            table["cases"][directory.name] = record(directory, arrays, directory.name)
            print(f"{directory.name}: {table['cases'][directory.name]['class']}", flush=True)
    np.savez_compressed(OUT / "golden.npz", **arrays)
    (OUT / "golden.json").write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}/golden.npz, golden.json", file=sys.stderr)


if __name__ == "__main__":
    main()
