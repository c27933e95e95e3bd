"""Qwen3: Qwen2 without the qkv bias, with QK-norm (an RMSNorm over each head's D features of
q and k before the rotation); class head_dim 128.

    model.layers.N.self_attn.{q,k}_norm.weight  [D]  -> attn.{q,k}_norm.scale  same
"""

from __future__ import annotations

from posenc_jax.pretrained.families import llama, qwen2
from posenc_jax.pretrained.families.record import GGUF, Family, Row
from posenc_jax.pretrained.families.transforms import SAME

__all__ = ["FAMILY", "QK_NORM"]

QK_NORM = tuple(
    Row(f"{llama.LAYER}self_attn.{x}_norm.weight", ((*llama.ATTN, f"{x}_norm", "scale"),), SAME)
    for x in "qk")

FAMILY = Family(
    model_type="qwen3",
    defaults={**qwen2.FAMILY.defaults, "head_dim": 128},
    hf_tensors=llama.FAMILY.hf_tensors + QK_NORM,
    export_class="Qwen3ForCausalLM",
    qk_norm=True,
    windows="qwen",
    gguf=GGUF(arch="qwen3", keys=llama.GGUF_KEYS,
              defaults={**qwen2.GGUF_DEFAULTS, "head_dim": 128, "attention_bias": False},
              block=llama.GGUF_BLOCK, top=llama.GGUF_TOP, complete=qwen2.all_full),
    claims=lambda cfg: cfg.qk_norm,
)
