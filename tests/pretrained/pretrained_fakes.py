"""Tiny Hugging Face-style checkpoints written from scratch (random tensors in Hugging Face
layout, a config.json), for the loader's own tests: no transformers involved."""

from __future__ import annotations

import json
import pathlib

import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from posenc_jax.model.config import TransformerConfig
from posenc_jax.pretrained.families import config_kwargs, family_of_config
from posenc_jax.pretrained.names import targets

BASE = {"vocab_size": 40, "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 48, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256, "rope_theta": 10000.0, "tie_word_embeddings": False}
CONFIGS = {
    "llama": {"model_type": "llama", "hidden_act": "silu"},
    "qwen2": {"model_type": "qwen2", "hidden_act": "silu"},
    "qwen3": {"model_type": "qwen3", "hidden_act": "silu", "head_dim": 8},
    "mistral": {"model_type": "mistral", "hidden_act": "silu", "sliding_window": 4},
    "gemma3_text": {"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh",
                    "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 4,
                    "layer_types": ["sliding_attention", "full_attention"],
                    "rope_local_base_freq": 10000.0, "tie_word_embeddings": True},
}


@nnx.jit
def forward(model, tokens):
    """A model's logits as one compiled program per structure and shape, not op by op (an
    eager forward compiles every primitive on its own: ~50-150 compiles a test)."""
    return model(tokens)


def hf_config(family: str, **overrides) -> dict:
    return {**BASE, **CONFIGS[family], **overrides}


def hf_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 tensors, one per name the family's model reads, in HF shapes."""
    family, _, _ = family_of_config(config, "fake")
    cfg = TransformerConfig(**config_kwargs(config, where="fake"))
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 0.3, t.hf_shape).astype(np.float32)
            for name, t in targets(cfg, family).items()}


def write(directory: pathlib.Path, config: dict, tensors: dict, shards: int = 1) -> pathlib.Path:
    """config.json + model.safetensors (or `shards` files and an index)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n] for n in names}, str(directory / "model.safetensors"))
        return directory
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: tensors[n] for n in part}, str(directory / file))
        weight_map.update(dict.fromkeys(part, file))
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory
