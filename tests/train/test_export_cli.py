"""`python -m train.export`: every option of its command line, and a run whose newest
checkpoints cannot be read (issue 34).

One tiny run (checkpoints at steps 2 and 3) serves every test; each test that breaks a
checkpoint breaks a copy. The CLI runs in a subprocess, as a user types it:

- `--step`, `--model_type`, `--max_shard_bytes` each change what is written (the step's own
  weights, the family named, shards plus an index), and a family that cannot hold the model
  is refused naming it;
- the newest checkpoint corrupt: the export falls back to the previous one and says on stderr
  which step it skipped and why; all corrupt: one line naming the directory and each step;
- `--step` of a step that is not there, a workdir without checkpoints: one line naming them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax.pretrained.loader import build
from posenc_jax.pretrained.safetensors_io import open_safetensors
from train import checkpoint as ckpt_lib
from train import export, trainer
from train.evaluation import load_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:the load_module")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("export")
    spec = importlib.util.spec_from_file_location("cfg_tiny", ROOT / "configs" / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.dataset.data_dir = str(root / "data")
    config.mesh.data = 1
    config.eval.lengths = ()
    trainer.train_and_evaluate(config, str(root / "run"), devices=jax.devices()[:1],
                               progress=False)
    steps = sorted(int(p.name) for p in (root / "run" / ckpt_lib.CHECKPOINT_DIR).iterdir()
                   if p.name.isdigit())
    assert steps == [2, 3]
    return root / "run"


def cli(*flags, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([sys.executable, "-m", "train.export", *flags], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def corrupt(run: pathlib.Path, tmp: pathlib.Path, *steps: int) -> pathlib.Path:
    """A copy of `run` whose checkpoints of `steps` have every file overwritten with bytes
    that are neither JSON nor UTF-8 (what a torn write leaves)."""
    copy = tmp / "copy"
    shutil.copytree(run, copy)
    for step in steps:
        for path in (copy / ckpt_lib.CHECKPOINT_DIR / str(step)).rglob("*"):
            if path.is_file():
                path.write_bytes(b"\xff\xfe\x00garbage" * 8)
    return copy


TOKENS = np.random.default_rng(0).integers(0, 256, (2, 32)).astype(np.int32)


@nnx.jit
def forward(model, tokens):
    """Logits as one compiled program per model structure (not op by op)."""
    return model(tokens)


def logits_of(directory) -> np.ndarray:
    """The exported model's logits (its norms are 1 + w, the trained model's s: compare
    outputs, not params)."""
    model, _, _ = build(open_safetensors(directory), attention="dense")
    return np.asarray(forward(model, jnp.asarray(TOKENS)))


def trained_logits(workdir, step) -> np.ndarray:
    model, _ = load_model(str(workdir), step=step, devices=jax.devices()[:1])
    return np.asarray(forward(model, jnp.asarray(TOKENS)))


def assert_close(a, b):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_every_option(run, tmp_path):
    out = tmp_path / "hf"
    proc = cli(f"--workdir={run}", f"--out={out}", "--step=2", "--model_type=gemma",
               "--max_shard_bytes=40000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = sorted(p.name for p in out.iterdir())
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) >= 2 and "model.safetensors.index.json" in names, names
    assert all((out / n).stat().st_size <= 40000 + 2000 for n in shards)  # + the header
    assert f"wrote {out}:" in proc.stdout
    assert json.loads((out / "config.json").read_text())["model_type"] == "gemma"
    step2, step3 = trained_logits(run, 2), trained_logits(run, 3)
    assert np.abs(step2 - step3).max() > 1e-3  # the two steps tell apart
    assert_close(logits_of(out), step2)  # --step=2, not the newest


def test_defaults_take_the_newest_step_in_one_file(run, tmp_path):
    files = export.export(str(run), str(tmp_path / "hf"))
    assert sorted(files) == ["config.json", "model.safetensors"]
    assert_close(logits_of(tmp_path / "hf"), trained_logits(run, 3))


def test_a_family_that_cannot_hold_the_model_is_refused(run, tmp_path):
    proc = cli(f"--workdir={run}", f"--out={tmp_path / 'hf'}", "--model_type=llama")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ValueError: cannot export this model as a "
                                  "transformers checkpoint"), proc.stderr[-2000:]
    assert "llama" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "hf").exists()


def test_newest_checkpoint_corrupt_falls_back_and_says_so(run, tmp_path):
    copy = corrupt(run, tmp_path, 3)
    proc = cli(f"--workdir={copy}", f"--out={tmp_path / 'hf'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "skipped unreadable checkpoint step 3: " in proc.stderr, proc.stderr[-2000:]
    assert_close(logits_of(tmp_path / "hf"), trained_logits(run, 2))
    assert (copy / ckpt_lib.CHECKPOINT_DIR / "3").is_dir()  # read only: nothing moved aside


def test_all_checkpoints_corrupt_is_one_line_naming_the_directory_and_steps(run, tmp_path):
    copy = corrupt(run, tmp_path, 2, 3)
    proc = cli(f"--workdir={copy}", f"--out={tmp_path / 'hf'}")
    assert proc.returncode == 1
    directory = copy / ckpt_lib.CHECKPOINT_DIR
    assert f"error: CheckpointError: no readable checkpoint in {directory} (step 3: " in (
        proc.stderr), proc.stderr[-2000:]
    assert "; step 2: " in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(("flags", "words"), [
    (["--step=99"], ["error: FileNotFoundError: no checkpoint of step 99 in",
                     "(steps: 2, 3)"]),
    (["--workdir=/nonexistent"], ["error: FileNotFoundError: no checkpoint directory "
                                  "/nonexistent/checkpoints (is --workdir=/nonexistent a "
                                  "training run's workdir?)"]),
], ids=["step-absent", "no-workdir"])
def test_missing_step_or_workdir(flags, words, run, tmp_path):
    own = any(f.startswith("--workdir") for f in flags)
    proc = cli(*([] if own else [f"--workdir={run}"]), f"--out={tmp_path / 'hf'}", *flags)
    assert proc.returncode == 1
    assert not [w for w in words if w not in proc.stderr], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "hf").exists()
