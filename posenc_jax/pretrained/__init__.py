"""Pretrained checkpoints (safetensors directories, GGUF files) read into the model.

    lm = posenc_jax.pretrained.load(path, dtype="float32", rope_scaling=None)
    lm.model, lm.config, lm.tokenizer, lm.hf_config
"""

from posenc_jax.pretrained.api import Pretrained, load, open_checkpoint

__all__ = ["Pretrained", "load", "open_checkpoint"]
