"""The real SmolLM2-135M through the CLI: YaRN x2, two LoRA steps on 256-token windows of the
bundled corpus read through its own tokenizer (scripts/finetune_golden_run.py), then
`python -m train.export`; transformers loaded that export with the logits in
tests/data/pretrained/finetune/ (scripts/make_finetune_golden.py, the throwaway golden venv),
and so must the export read back by our loader. Needs the GGUF file ($POSENC_PRETRAINED_DIR or
<repo>/.pretrained, `bash scripts/fetch_pretrained.sh DIR`). The export is read back with
`scan_layers=True` (one block compiled, not 30: tests/model/test_scan.py holds scan == loop).
"""

import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from posenc_jax import pretrained

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "pretrained" / "finetune"
TOLERANCE = 2e-3  # float32 sums in another order over 30 layers (as the export golden)


def _run_module():
    spec = importlib.util.spec_from_file_location("finetune_golden_run",
                                                  ROOT / "scripts" / "finetune_golden_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUN = _run_module()
pytestmark = [pytest.mark.slow, pytest.mark.optimized_compile, pytest.mark.skipif(
    not RUN.checkpoint().is_file(), reason=f"{RUN.checkpoint()} is missing "
    "(bash scripts/fetch_pretrained.sh DIR, then POSENC_PRETRAINED_DIR=DIR)")]


def test_smollm2_yarn_finetune_cli_and_export_equal_transformers(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    workdir, out = tmp_path / "run", tmp_path / "hf"
    done = subprocess.run(RUN.train_command(sys.executable, str(workdir), str(tmp_path / "d")),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: step=2" in done.stdout
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(x)["loss"] for x in lines if x.strip()]
    golden = json.loads((GOLDEN / "golden.json").read_text())
    assert len(losses) == 2 and all(0.5 < v < 8 for v in losses)  # a trained LM's loss
    np.testing.assert_allclose(losses, golden["losses"], rtol=0, atol=1e-3)
    exported = subprocess.run(RUN.export_command(sys.executable, str(workdir), str(out)),
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert exported.returncode == 0, exported.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] == "yarn"
    assert config["rope_scaling"]["factor"] == 2.0
    assert config["max_position_embeddings"] == 16384 == golden["config"][
        "max_position_embeddings"]
    lm = pretrained.load(out, attention="blockwise")
    lm.model.config = dataclasses.replace(lm.model.config, scan_layers=True)
    ids = RUN.token_ids(config["vocab_size"])
    logits = np.asarray(lm.model(jnp.asarray(ids, jnp.int32)))
    arrays = np.load(GOLDEN / "golden.npz")
    diff = float(np.abs(logits[..., :arrays["logits"].shape[-1]] - arrays["logits"]).max())
    assert diff <= TOLERANCE, f"max |ours - transformers| = {diff:.3g}"
    np.testing.assert_allclose(logits.max(-1), arrays["max"], rtol=0, atol=TOLERANCE)
