"""Qwen2 (and Qwen2.5): Llama + biases on q, k and v; sliding windows on the layers from
`max_window_layers` on, only when `use_sliding_window`.

    model.layers.N.self_attn.{q,k,v}_proj.bias  [N*D]  -> attn.{q,k,v}_bias [N, D]  bias_heads

GGUF: the `qwen2` architecture, tensors as Llama's without the q / k row permutation; every
layer full attention in the config transformers builds.
"""

from __future__ import annotations

from posenc_jax.pretrained.families import llama
from posenc_jax.pretrained.families.record import GGUF, Family, Row
from posenc_jax.pretrained.families.transforms import BIAS_HEADS

__all__ = ["FAMILY", "GGUF_DEFAULTS", "all_full"]

QKV_BIAS = tuple(
    Row(f"{llama.LAYER}self_attn.{x}_proj.bias", ((*llama.ATTN, f"{x}_bias"),), BIAS_HEADS)
    for x in "qkv")
GGUF_DEFAULTS = {**llama.GGUF_BASE, "max_position_embeddings": 32768,
                 "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28}


def all_full(config: dict, rope_theta: float) -> None:
    """transformers' Qwen configs from GGUF list every layer as full attention."""
    config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]


FAMILY = Family(
    model_type="qwen2",
    defaults={**llama.FAMILY.defaults, "use_sliding_window": False, "max_window_layers": 28},
    hf_tensors=llama.FAMILY.hf_tensors + QKV_BIAS,
    export_class="Qwen2ForCausalLM",
    qkv_bias=True,
    windows="qwen",
    gguf=GGUF(arch="qwen2", keys=llama.GGUF_KEYS, defaults=GGUF_DEFAULTS, block=llama.GGUF_BLOCK,
              top=llama.GGUF_TOP, complete=all_full),
    claims=lambda cfg: cfg.qkv_bias,
)
