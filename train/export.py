"""`python -m train.export --workdir=RUN --out=DIR [--step=N] [--model_type=...]`.

The newest readable checkpoint of a training run (or `--step`) out as a Hugging Face
checkpoint directory (`posenc_jax.pretrained.save`): config.json + model.safetensors, which
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads. A model trained here scales
its embeddings by sqrt(E) and so exports as model_type "gemma" (SwiGLU: hidden_act "silu");
`max_position_embeddings` is the run's `seq_len` unless its RoPE names one. A model no
transformers family can express (ALiBi, T5, KERPLE, FIRE, CoPE, sinusoidal, ...) is refused
with one line naming the part, and nothing is written. Newer checkpoints that cannot be read
are skipped, each named on stderr with its reason ("skipped unreadable checkpoint step 30:
..."); when none can be read, one line names the directory and every step's reason.

A run that started from a pretrained checkpoint (`config.init.checkpoint`) exports as that
checkpoint's family, with its config.json's token ids and the run's RoPE (the new
`rope_scaling`, and the max_position_embeddings it implies), its LoRA adapters merged into
the weights, and the checkpoint's tokenizer files.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax
from absl import app, flags, logging

from posenc_jax.pretrained.save import save
from train import checkpoint as ckpt_lib
from train import from_checkpoint, sharding
from train.evaluation import load_model

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "The training run's workdir (its checkpoints/).")
flags.DEFINE_string("out", None, "Directory to write the Hugging Face checkpoint into.")
flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest readable one).")
flags.DEFINE_string("model_type", None, "Family to write (default: chosen from the model).")
flags.DEFINE_integer("max_shard_bytes", 5 * 10**9, "Shard the weights past this size.")
flags.mark_flags_as_required(["workdir", "out"])


def newest_readable(workdir: str, *, step: int | None = None, mesh=None,
                    skipped: list[str] | None = None) -> tuple[Any, Any, int]:
    """(model, config, step) of the newest checkpoint of `workdir` that restores (or of
    `step`). Each newer one that does not is appended to `skipped` as "step N: <why>"; the
    run's directory is only read (nothing moved aside, unlike a resumed training run).

    Raises FileNotFoundError (no checkpoint directory or no step in it, or no such `step`),
    CheckpointError naming the directory and every step's reason when none restores."""
    directory = os.path.join(os.path.abspath(workdir), ckpt_lib.CHECKPOINT_DIR)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no checkpoint directory {directory} (is --workdir={workdir} "
                                "a training run's workdir?)")
    steps = sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    if step is not None and step not in steps:
        raise FileNotFoundError(f"no checkpoint of step {step} in {directory} (steps: "
                                f"{', '.join(map(str, steps)) or 'none'})")
    if not steps:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    reasons = []
    for candidate in [step] if step is not None else reversed(steps):
        try:
            model, config = load_model(workdir, step=candidate, mesh=mesh)
            return model, config, candidate
        except Exception as err:  # noqa: BLE001 -- any failure means "unreadable"
            reason = f"step {candidate}: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
            reasons.append(reason)
            if skipped is not None:
                skipped.append(reason)
    raise ckpt_lib.CheckpointError(f"no readable checkpoint in {directory} ({'; '.join(reasons)})")


def export(workdir: str, out: str, *, step: int | None = None, model_type: str | None = None,
           max_shard_bytes: int = 5 * 10**9, skipped: list[str] | None = None) -> list[str]:
    """Writes the run's model to `out` (see the module docstring); returns the files.
    `skipped` collects the newer checkpoints that could not be read (`newest_readable`)."""
    mesh = sharding.make_mesh({"data": -1}, devices=jax.devices()[:1])  # one host device
    model, config, _ = newest_readable(workdir, step=step, mesh=mesh, skipped=skipped)
    base, tokenizer = {"max_position_embeddings": int(config.seq_len)}, None
    if from_checkpoint.checkpoint_path(config):
        _, base = from_checkpoint.model_config(config)
        model_type = model_type or from_checkpoint.model_type(config)
        if config.dataset.get("tokenizer") == "checkpoint":
            tokenizer = from_checkpoint.tokenizer(config)
    return save(model, out, model_type=model_type, hf_config_base=base, tokenizer=tokenizer,
                max_shard_bytes=max_shard_bytes)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    skipped: list[str] = []
    try:
        files = export(FLAGS.workdir, FLAGS.out, step=FLAGS.step, model_type=FLAGS.model_type,
                       max_shard_bytes=FLAGS.max_shard_bytes, skipped=skipped)
    except (ValueError, FileNotFoundError, ckpt_lib.CheckpointError) as err:
        files, error = None, f"error: {type(err).__name__}: {err}"
    for reason in skipped:
        print(f"skipped unreadable checkpoint {reason}", file=sys.stderr, flush=True)
    if files is None:
        sys.exit(error)
    print(f"wrote {FLAGS.out}: {', '.join(files)}", flush=True)


if __name__ == "__main__":
    app.run(main)
