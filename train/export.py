"""`python -m train.export --workdir=RUN --out=DIR [--step=N] [--model_type=...]`.

The newest readable checkpoint of a training run (or `--step`) out as a Hugging Face
checkpoint directory (`posenc_jax.pretrained.save`): config.json + model.safetensors, which
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads. A model trained here scales
its embeddings by sqrt(E) and so exports as model_type "gemma" (SwiGLU: hidden_act "silu");
`max_position_embeddings` is the run's `seq_len` unless its RoPE names one. A model no
transformers family can express (ALiBi, T5, KERPLE, FIRE, CoPE, sinusoidal, ...) is refused
with one line naming the part, and nothing is written.

A run that started from a pretrained checkpoint (`config.init.checkpoint`) exports as that
checkpoint's family, with its config.json's token ids and the run's RoPE (the new
`rope_scaling`, and the max_position_embeddings it implies), its LoRA adapters merged into
the weights, and the checkpoint's tokenizer files.
"""

from __future__ import annotations

import sys

import jax
from absl import app, flags, logging

from posenc_jax.pretrained.save import save
from train import from_checkpoint, sharding
from train.evaluation import load_model

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "The training run's workdir (its checkpoints/).")
flags.DEFINE_string("out", None, "Directory to write the Hugging Face checkpoint into.")
flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest readable one).")
flags.DEFINE_string("model_type", None, "Family to write (default: chosen from the model).")
flags.DEFINE_integer("max_shard_bytes", 5 * 10**9, "Shard the weights past this size.")
flags.mark_flags_as_required(["workdir", "out"])


def export(workdir: str, out: str, *, step: int | None = None, model_type: str | None = None,
           max_shard_bytes: int = 5 * 10**9) -> list[str]:
    """Writes the run's model to `out` (see the module docstring); returns the files."""
    mesh = sharding.make_mesh({"data": -1}, devices=jax.devices()[:1])  # one host device
    model, config = load_model(workdir, step=step, mesh=mesh)
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
    try:
        files = export(FLAGS.workdir, FLAGS.out, step=FLAGS.step, model_type=FLAGS.model_type,
                       max_shard_bytes=FLAGS.max_shard_bytes)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"error: {type(err).__name__}: {err}")
    print(f"wrote {FLAGS.out}: {', '.join(files)}", flush=True)


if __name__ == "__main__":
    app.run(main)
