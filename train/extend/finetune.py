"""The fine-tuned row of the extension study (the accelerator run's `extend_finetune` section):
SmolLM2 with YaRN x4 fine-tuned at 4C = 32,768 tokens, measured before and after.

    python -m train.extend.finetune --out=DIR [--steps=200] [--smoke]

A config of the project's one fine-tuning path, nothing else: `configs/extend_finetune.py`
run by `train.trainer` (sharded, checkpointed, resumable), with

  init         SmolLM2-135M's GGUF file ($POSENC_PRETRAINED_DIR or --pretrained_dir),
               rope_scaling "yarn:4" (the registry's stretch rule from its context C = 8192)
  training     full fine-tune, one window of 4C tokens a step, AdamW at 2e-5 (the YaRN paper),
               bfloat16 compute over float32 weights, the chunked loss, remat "block",
               attention "auto" (the kernel on a GPU)
  data         the bundled corpus through SmolLM2's tokenizer, documents joined by EOS
  measures     `train.extension_eval` before the first step and at the end: perplexity by
               position bucket over the first 4C held-out tokens, passkey at C, 2C and 4C

DIR/extend_finetune.md and .json are the run's before / after report; the run itself is in
DIR/extend_finetune_run (rerunning the command resumes it). --smoke: the same path on the tiny
llama checkpoint of tests/data (C = 64, 128-token windows, three steps), in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import shutil
import sys

from train import trainer
from train.extension_eval import REPORT

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = ROOT / "tests/data/pretrained/tiny/llama"  # the smoke's tiny checkpoint
FACTOR = 4


def base_config():
    spec = importlib.util.spec_from_file_location("extend_finetune_config",
                                                  ROOT / "configs" / "extend_finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def section_config(*, checkpoint: str, context: int, steps: int, lr: float, smoke: bool):
    """configs/extend_finetune.py set up as the module docstring says."""
    config = base_config()
    length = FACTOR * context
    config.init.checkpoint, config.init.rope_scaling = checkpoint, f"yarn:{FACTOR}"
    config.seq_len, config.batch_size, config.num_train_steps = length, 1, steps
    config.learning_rate, config.warmup_steps = lr, min(10, steps // 10)
    config.checkpoint_every_steps, config.log_every_steps = 50, max(1, steps // 20)
    config.model.dtype = "float32" if smoke else "bfloat16"
    config.model.remat = "block"
    config.eval.lengths = ()  # the buckets hold the perplexity
    config.eval.extension.update(enabled=True, length=length,
                                 passkey_lengths=(256,) if smoke else (
                                     context, 2 * context, length))
    if smoke:
        config.model.attention, config.model.block_size = "blockwise", 64
        config.dataset.max_tokens, config.loss_chunk = 100_000, 64
    return config


def run(args) -> dict:
    """Trains and measures (module docstring); returns the trainer's result."""
    if args.smoke:
        checkpoint, context = str(TINY), 32  # yarn:4 from the file's 64 -> 128-token windows
        args.steps, args.lr = min(args.steps, 3), 1e-3
    else:
        root = args.pretrained_dir or os.environ.get("POSENC_PRETRAINED_DIR") or str(
            ROOT / ".pretrained")
        checkpoint, context = os.path.join(root, SMOLLM2), 8192
        if not os.path.exists(checkpoint):
            raise SystemExit(f"extend_finetune: {checkpoint} is missing (bash "
                             "scripts/fetch_pretrained.sh DIR, then --pretrained_dir=DIR)")
    config = section_config(checkpoint=checkpoint, context=context, steps=args.steps,
                            lr=args.lr, smoke=args.smoke)
    if args.smoke:
        config.dataset.data_dir = os.path.join(args.out, "data")
    workdir = os.path.join(args.out, "extend_finetune_run")
    os.makedirs(workdir, exist_ok=True)
    result = trainer.train_and_evaluate(config, workdir, progress=not args.smoke)
    for ext in (".md", ".json"):
        report = os.path.join(workdir, REPORT + ext)
        if os.path.exists(report):
            shutil.copyfile(report, os.path.join(args.out, "extend_finetune" + ext))
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--pretrained_dir", default="")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = run(args)
    except trainer.USER_ERRORS as err:
        raise SystemExit(f"error: {type(err).__name__}: {err}") from None
    print("done: " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in result.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
