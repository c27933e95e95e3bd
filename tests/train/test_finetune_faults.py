"""A LoRA fine-tune from a pretrained checkpoint survives SIGKILL: `python -m train
--config=configs/extend_finetune.py --config.init.checkpoint=...` killed mid-run and rerun ends
with adapters, frozen base, optimizer state and metrics bit-identical to an uninterrupted run
(which runs in this process on one device), every step logged exactly once.
"""

import json
import pathlib
import signal
import subprocess
import sys

import jax
import pytest
from test_finetune_from_checkpoint import TINY, ft_config, losses, saved
from test_train_faults import assert_bit_identical, env_for, start_and_signal

from train import trainer

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = {"num_train_steps": 30, "checkpoint_every_steps": 2, "lora.enabled": True,
       "lora.rank": 4, "lora.train_embeddings": True, "init.rope_scaling": "yarn:2"}


def cli(workdir, data_dir) -> list[str]:
    flags = {"init.checkpoint": TINY / "llama", "dataset.data_dir": data_dir,
             "num_train_steps": 30, "checkpoint_every_steps": 2, "batch_size": 4,
             "seq_len": 32, "learning_rate": 1e-2, "warmup_steps": 0, "log_every_steps": 1,
             "loss_chunk": 8, "model.attention": "blockwise", "model.block_size": 16,
             "dataset.max_tokens": 50_000, "eval.lengths": "()", "mesh.data": 1,
             "lora.enabled": True, "lora.rank": 4, "lora.train_embeddings": True,
             "init.rope_scaling": "yarn:2"}
    return [sys.executable, "-m", "train", f"--config={ROOT / 'configs' / 'extend_finetune.py'}",
            f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in flags.items())]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.mark.optimized_compile  # bit for bit against the trainer run in this process: both at XLA's defaults
def test_sigkill_then_rerun_is_bit_identical(data_dir, tmp_path):
    reference = tmp_path / "reference"
    config = ft_config(data_dir, **RUN)
    trainer.train_and_evaluate(config, str(reference), devices=jax.devices()[:1],
                               progress=False)
    workdir, env = tmp_path / "killed", env_for(tmp_path / "xla_cache")
    rc, _, err = start_and_signal(cli(workdir, data_dir), env, workdir, at_step=5,
                                  sig=signal.SIGKILL)
    assert rc == -signal.SIGKILL, err[-2000:]
    done = subprocess.run(cli(workdir, data_dir), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    _, a = saved(config, reference)
    _, b = saved(config, workdir)
    assert_bit_identical(a, b)
    steps = [json.loads(line)["step"] for line in
             (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert steps == list(range(1, 31))
    assert losses(workdir) == losses(reference)
