"""Pretrained checkpoints (safetensors directories, GGUF files) read into the model, and out.

    lm = posenc_jax.pretrained.load(path, dtype="float32", rope_scaling=None)
    lm.model, lm.config, lm.tokenizer, lm.hf_config
    posenc_jax.pretrained.save(lm, directory)          # a directory transformers loads
"""

from posenc_jax.pretrained.api import Pretrained, load, open_checkpoint
from posenc_jax.pretrained.save import save

__all__ = ["Pretrained", "load", "open_checkpoint", "save"]
