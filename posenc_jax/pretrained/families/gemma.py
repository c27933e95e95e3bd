"""Gemma (1): sqrt(E) embedding scale and (1 + w) norms on the Llama decoder, GeGLU.

Also what a model trained here exports as: its embeddings are scaled by sqrt(E) (with
`hidden_act: "silu"` for SwiGLU). Tensors as Llama's; the stored norm weights are `w` of a
(1 + w) norm (export adds the difference of the two offsets). No GGUF reader.
"""

from __future__ import annotations

from posenc_jax.pretrained.families import llama
from posenc_jax.pretrained.families.record import Family

__all__ = ["FAMILY"]

FAMILY = Family(
    model_type="gemma",
    defaults={"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "head_dim": 256,
              "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192},
    hf_tensors=llama.FAMILY.hf_tensors,
    export_class="GemmaForCausalLM",
    activations={"gelu": "geglu", "gelu_pytorch_tanh": "geglu", "silu": "swiglu"},
    scaled=True,
    claims=lambda cfg: cfg.embed_scale is not None,
)
