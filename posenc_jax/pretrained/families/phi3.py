"""Phi-3 (and Phi-3.5): the Llama decoder with fused projections and LongRoPE.

    model.layers.N.self_attn.qkv_proj.weight  [(H+2K)*D, E] -> attn.q_proj [E, H, D],
                                                              attn.k_proj, attn.v_proj [E, K, D]
    model.layers.N.mlp.gate_up_proj.weight    [2F, E]       -> mlp.gate, mlp.up [E, F]
    (embeddings, o_proj, down_proj and the two norms as Llama's)

The fused tensors are split along their rows on load (q rows, then k, then v; gate, then up:
`Phi3MLP` chunks gate_up_proj's output into gate and up in that order) and concatenated again
on export. RoPE: `rope_parameters` of type "longrope" with `short_factor` / `long_factor`, the
class default `original_max_position_embeddings` 4096 (read by `posenc_jax.encodings.hf`, which
also knows Phi-3 rotates the first int(D * partial_rotary_factor) features); a sequence whose
last position + 1 exceeds the original length uses the long factors, else the short ones.
Windows: `sliding_window` on every layer when set (null in Phi-3.5). No GGUF reader.
"""

from __future__ import annotations

from posenc_jax.pretrained.families import llama
from posenc_jax.pretrained.families.record import Family, Row
from posenc_jax.pretrained.families.transforms import HEADS_IN, TRANSPOSE

__all__ = ["FAMILY"]

FUSED = (
    Row(llama.LAYER + "self_attn.qkv_proj.weight",
        tuple((*llama.ATTN, f"{x}_proj") for x in "qkv"), HEADS_IN),
    llama.ATTENTION[3],  # o_proj
    Row(llama.LAYER + "mlp.gate_up_proj.weight",
        (("layers", "{i}", "mlp", "gate"), ("layers", "{i}", "mlp", "up")), TRANSPOSE,
        moe=False),
    llama.MLP[2],  # down_proj
)

FAMILY = Family(
    model_type="phi3",
    defaults={"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
              "sliding_window": None},
    hf_tensors=llama.EMBED_HEAD + FUSED + llama.NORMS,
    export_class="Phi3ForCausalLM",
    windows="all",
    partial_rotary=True,
    rope_top_level=("original_max_position_embeddings",),
)
