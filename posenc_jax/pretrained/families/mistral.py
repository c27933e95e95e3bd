"""Mistral: Llama with a sliding window on every layer (`sliding_window`, class default 4096).

Tensors as Llama's. GGUF: llama.cpp writes Mistral as the `llama` architecture; transformers
reads it as Mistral only when `general.name` is exactly "mistral" (its rule, kept).
"""

from __future__ import annotations

from posenc_jax.pretrained.families import llama
from posenc_jax.pretrained.families.record import GGUF, Family

__all__ = ["FAMILY"]

FAMILY = Family(
    model_type="mistral",
    defaults={**llama.FAMILY.defaults, "sliding_window": 4096},
    hf_tensors=llama.FAMILY.hf_tensors,
    export_class="MistralForCausalLM",
    windows="all",
    gguf=GGUF(arch="llama", name="mistral", keys=llama.FAMILY.gguf.keys,
              defaults={**llama.GGUF_BASE, "max_position_embeddings": 4096 * 32,
                        "sliding_window": 4096},
              block=llama.GGUF_BLOCK, top=llama.GGUF_TOP, fixes=llama.FAMILY.gguf.fixes,
              complete=llama.head_dim_from_width),
    claims=lambda cfg: cfg.sliding_window is not None,
)
