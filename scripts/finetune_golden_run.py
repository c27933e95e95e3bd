"""The SmolLM2 fine-tune that tests/train/test_finetune_smollm2.py runs and
scripts/make_finetune_golden.py exports for transformers: the one command a user types.

    python -m train --config=configs/extend_finetune.py --workdir=W \
        --config.init.checkpoint=<dir>/SmolLM2-135M-Instruct.Q4_1.gguf \
        --config.init.rope_scaling=yarn:2 --config.seq_len=256 --config.num_train_steps=2 ...
    python -m train.export --workdir=W --out=OUT

As cheap as a real run gets on a CPU: LoRA (rank 8, q/k/v/o; the base frozen, so the
optimizer holds only the adapters), one 256-token window a step (a step's time is its tokens
through 30 layers: 1,024-token windows cost the suite ~100 s more on a loaded 2-core machine,
issue 36), the chunked loss, the layers as one scan (one block to compile), blockwise
attention in 128-token blocks, 200k tokens of the bundled corpus; learning rate 1e-3 so that
two steps move the adapters measurably.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Token ids whose logits the golden records (320 > 256: past the window it trained on).
NUM_TOKENS = 320
SEED = 0


def checkpoint() -> pathlib.Path:
    return pathlib.Path(os.environ.get("POSENC_PRETRAINED_DIR") or ROOT / ".pretrained") / FILE


def flags(data_dir: str) -> dict[str, object]:
    return {"init.checkpoint": checkpoint(), "init.rope_scaling": "yarn:2", "seq_len": 256,
            "num_train_steps": 2, "batch_size": 1, "learning_rate": 1e-3, "warmup_steps": 0,
            "log_every_steps": 1, "checkpoint_every_steps": 2, "loss_chunk": 128,
            "lora.enabled": True, "model.scan_layers": True, "model.attention": "blockwise",
            "model.block_size": 128, "dataset.max_tokens": 200_000,
            "dataset.data_dir": data_dir, "eval.lengths": "()", "mesh.data": 1}


def train_command(python: str, workdir: str, data_dir: str) -> list[str]:
    return [python, "-m", "train", f"--config={ROOT / 'configs' / 'extend_finetune.py'}",
            f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in flags(data_dir).items())]


def export_command(python: str, workdir: str, out: str) -> list[str]:
    return [python, "-m", "train.export", f"--workdir={workdir}", f"--out={out}"]


def token_ids(vocab_size: int):
    """The golden's input: NUM_TOKENS ids drawn from a fixed generator (numpy only)."""
    return np.random.default_rng(SEED).integers(0, vocab_size, (1, NUM_TOKENS))
