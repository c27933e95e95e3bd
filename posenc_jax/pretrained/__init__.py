"""Pretrained checkpoints (safetensors directories, GGUF files) read into the model."""
