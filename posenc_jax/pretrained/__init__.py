"""Pretrained checkpoints (safetensors directories, GGUF files) read into the model."""

from posenc_jax.pretrained.save import save

__all__ = ["save"]
