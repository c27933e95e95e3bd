"""Pretrained checkpoints (safetensors directories, GGUF files) read into the model, and out.

    lm = pretrained.load(path, dtype="float32", rope_scaling=None)   # .model .config .tokenizer
    pretrained.save(lm, directory)                                   # transformers loads it
"""

from posenc_jax.pretrained.load import Pretrained, load, open_checkpoint
from posenc_jax.pretrained.save import save

__all__ = ["Pretrained", "load", "open_checkpoint", "save"]
