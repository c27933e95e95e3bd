"""Llama (2 / 3 / 3.1 / 3.2, SmolLM2): the plain decoder every other record here starts from.

No embedding scale, SwiGLU, two norms per block, q / k / v / o projections without bias. Its
tables are the building blocks the Llama-style records reuse (`EMBED_HEAD`, `ATTENTION`,
`MLP`, `NORMS`; `GGUF_KEYS`, `GGUF_BLOCK`, `GGUF_TOP`, `GGUF_BASE`).

    Hugging Face name                               -> our param                  layout
    model.embed_tokens.weight          [V, E]       -> embedding [V, E]          same
    model.norm.weight                  [E]          -> final_norm.scale          same
    lm_head.weight                     [V, E]       -> unembed [E, V] (untied)   transpose
    model.layers.N.self_attn.q_proj    [H*D, E]     -> layers.N.attn.q_proj      heads_in
    model.layers.N.self_attn.k/v_proj  [K*D, E]     -> attn.k_proj / v_proj      heads_in
    model.layers.N.self_attn.o_proj    [E, H*D]     -> attn.o_proj [H, D, E]     heads_out
    model.layers.N.mlp.gate/up_proj    [F, E]       -> mlp.gate / mlp.up [E, F]  transpose
    model.layers.N.mlp.down_proj       [E, F]       -> mlp.down [F, E]           transpose
    model.layers.N.input_layernorm     [E]          -> attn_norm.scale           same
    model.layers.N.post_attention_layernorm         -> mlp_norm.scale            same

GGUF (llama.cpp's `llama` architecture): q / k rows stored permuted for its interleaved RoPE,
put back on read; `rope.dimension_count` is the head dim.
"""

from __future__ import annotations

from posenc_jax.pretrained.families.record import GGUF, Family, Row
from posenc_jax.pretrained.families.transforms import (
    HEADS_IN,
    HEADS_OUT,
    SAME,
    TRANSPOSE,
    unpermute_k,
    unpermute_q,
)

__all__ = ["ATTENTION", "EMBED_HEAD", "FAMILY", "GGUF_BASE", "GGUF_BLOCK", "GGUF_KEYS",
           "GGUF_TOP", "MLP", "NORMS"]

LAYER = "model.layers.{i}."
ATTN = ("layers", "{i}", "attn")

EMBED_HEAD = (
    Row("model.embed_tokens.weight", (("embedding",),), SAME),
    Row("model.norm.weight", (("final_norm", "scale"),), SAME),
    Row("lm_head.weight", (("unembed",),), TRANSPOSE),
)
ATTENTION = (
    Row(LAYER + "self_attn.q_proj.weight", ((*ATTN, "q_proj"),), HEADS_IN),
    Row(LAYER + "self_attn.k_proj.weight", ((*ATTN, "k_proj"),), HEADS_IN),
    Row(LAYER + "self_attn.v_proj.weight", ((*ATTN, "v_proj"),), HEADS_IN),
    Row(LAYER + "self_attn.o_proj.weight", ((*ATTN, "o_proj"),), HEADS_OUT),
)
# the dense MLP (`moe=False`: a MoE layer's stacked mlp.gate / up / down are not these)
MLP = tuple(Row(f"{LAYER}mlp.{x}_proj.weight", (("layers", "{i}", "mlp", x),), TRANSPOSE,
                moe=False) for x in ("gate", "up", "down"))
NORMS = (
    Row(LAYER + "input_layernorm.weight", (("layers", "{i}", "attn_norm", "scale"),), SAME),
    Row(LAYER + "post_attention_layernorm.weight", (("layers", "{i}", "mlp_norm", "scale"),),
        SAME),
)

# GGUF `<arch>.<key>` -> config.json key (transformers' GGUF_CONFIG_MAPPING).
GGUF_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "vocab_size": "vocab_size",
}
# What the config classes write into config.json when not given (transformers 5.24).
GGUF_BASE = {"initializer_range": 0.02, "use_cache": True, "attention_dropout": 0.0,
             "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "rope_theta": 10000.0,
             "hidden_act": "silu"}
GGUF_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
GGUF_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
            "output": "lm_head"}


def head_dim_from_width(config: dict, rope_theta: float) -> None:
    """A llama GGUF without `rope.dimension_count`: head_dim = hidden_size / heads."""
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])


FAMILY = Family(
    model_type="llama",
    defaults={"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu"},
    hf_tensors=EMBED_HEAD + ATTENTION + MLP + NORMS,
    export_class="LlamaForCausalLM",
    gguf=GGUF(arch="llama", keys={**GGUF_KEYS, "rope.dimension_count": "head_dim"},
              defaults={**GGUF_BASE, "pretraining_tp": 1, "attention_bias": False,
                        "mlp_bias": False},
              block=GGUF_BLOCK, top=GGUF_TOP,
              fixes={"attn_q": unpermute_q, "attn_k": unpermute_k},
              complete=head_dim_from_width),
    claims=lambda cfg: True,
)
