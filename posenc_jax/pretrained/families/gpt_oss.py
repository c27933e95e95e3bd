"""gpt-oss (`GptOssForCausalLM`): learned sinks, alternating sliding / full layers, YaRN, attention
biases, and a mixture of experts with gpt-oss's clamped SwiGLU in every layer.

    Hugging Face name                                    -> our param                layout
    model.layers.N.self_attn.q/k/v_proj.weight, .bias    -> attn.q/k/v_proj, _bias   heads_in,
                                                                                     bias_heads
    model.layers.N.self_attn.o_proj.weight   [E, H*D]    -> attn.o_proj [H, D, E]    heads_out
    model.layers.N.self_attn.o_proj.bias     [E]         -> attn.o_bias [E]          same
    model.layers.N.self_attn.sinks           [H]         -> attn.sinks [H]           same
    model.layers.N.mlp.router.weight         [X, E]      -> mlp.router [E, X]        transpose
    model.layers.N.mlp.router.bias           [X]         -> mlp.router_bias          same
    model.layers.N.mlp.experts.gate_up_proj  [X, E, 2F]  -> mlp.gate, mlp.up         alternate
                                                            [X, E, F] (gate = even columns)
    model.layers.N.mlp.experts.gate_up_proj_bias [X, 2F] -> mlp.gate_bias, up_bias   alternate
    model.layers.N.mlp.experts.down_proj     [X, F, E]   -> mlp.down [X, F, E]       same
    model.layers.N.mlp.experts.down_proj_bias [X, E]     -> mlp.down_bias            same
    (embeddings, lm_head and the two norms as Llama's)

Config (transformers 5.x `GptOssConfig`): `attention_bias` (default true) puts biases on q, k,
v and o; `layer_types` (default: sliding on even layers, full on odd ones) places
`sliding_window` (128); RoPE is the half layout with the class's YaRN default (factor 32,
`truncate: false`, original 4096) when config.json has none (`posenc_jax.encodings.hf`);
router: top-k logits, softmax over those k (`router="topk_softmax"`); experts: the clamped
SwiGLU `(clip(u, -7, 7) + 1) * g * sigmoid(1.702 g)`, g = min(gate, 7) -- `swiglu_limit` and
`swiglu_alpha` other than 7.0 / 1.702 are refused (the model's constants). MXFP4-quantized
checkpoints (`quantization_config`) are refused. No GGUF reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc_jax.checks import finite_float, json_count
from posenc_jax.pretrained.families import llama, qwen2
from posenc_jax.pretrained.families.moe_keys import moe_kwargs, refuse_quantized, single
from posenc_jax.pretrained.families.record import Family, Row, refuse
from posenc_jax.pretrained.families.transforms import SAME, TRANSPOSE

__all__ = ["FAMILY", "O_BIAS", "SWIGLU"]

#: The clamped SwiGLU's constants the model computes (`posenc_jax.model.mlp`).
SWIGLU = {"swiglu_limit": 7.0, "swiglu_alpha": 1.702}
MLP = ("layers", "{i}", "mlp")
O_BIAS = Row(llama.LAYER + "self_attn.o_proj.bias", ((*llama.ATTN, "o_bias"),), SAME)
SINKS = Row(llama.LAYER + "self_attn.sinks", ((*llama.ATTN, "sinks"),), SAME)
EXPERTS = (
    Row(llama.LAYER + "mlp.router.weight", ((*MLP, "router"),), TRANSPOSE),
    Row(llama.LAYER + "mlp.router.bias", ((*MLP, "router_bias"),), SAME),
    Row(llama.LAYER + "mlp.experts.gate_up_proj", ((*MLP, "gate"), (*MLP, "up")), SAME,
        split="alternate"),
    Row(llama.LAYER + "mlp.experts.gate_up_proj_bias", ((*MLP, "gate_bias"), (*MLP, "up_bias")),
        SAME, split="alternate"),
    Row(llama.LAYER + "mlp.experts.down_proj", ((*MLP, "down"),), SAME),
    Row(llama.LAYER + "mlp.experts.down_proj_bias", ((*MLP, "down_bias"),), SAME),
)


def layer_types(flat: Mapping[str, Any], num_layers: int, where: Any) -> list[str]:
    """config.json's `layer_types`, else GptOssConfig's default (sliding, full, sliding, ...)."""
    types = flat.get("layer_types")
    if types is None:
        return ["sliding_attention" if (i + 1) % 2 else "full_attention"
                for i in range(num_layers)]
    if isinstance(types, str) or not all(t in ("sliding_attention", "full_attention")
                                         for t in types) or len(types) != num_layers:
        raise refuse(where, "layer_types", types, f"{num_layers} entries, each "
                     "'sliding_attention' or 'full_attention'")
    return list(types)


def read_keys(flat: Mapping[str, Any], out: dict, where: Any) -> None:
    """The MoE, the clamped SwiGLU's constants and the per-layer windows (module docstring)."""
    refuse_quantized(flat, where)
    for key, value in SWIGLU.items():
        got = finite_float(key, flat.get(key, value))
        if got != value:
            raise refuse(where, key, got, f"only {value}: the model's clamped SwiGLU")
    window = flat.get("sliding_window")
    window = None if window is None else json_count("sliding_window", window)
    types = layer_types(flat, out["num_layers"], where)
    out.update(moe_kwargs(flat, where), moe_mlp_dim=out["mlp_dim"], router="topk_softmax",
               router_bias=True, expert_bias=True,
               sliding_window=None if window is None else [
                   window if t == "sliding_attention" else None for t in types])


def write_keys(cfg: Any, out: dict) -> None:
    """gpt-oss's keys for `cfg` (read back by `read_keys` and compared by the exporter)."""
    windows = cfg.sliding_window or (None,) * cfg.num_layers
    out.update(attention_bias=cfg.o_bias, num_local_experts=cfg.num_experts,
               num_experts_per_tok=cfg.experts_per_token, intermediate_size=cfg.moe_mlp_dim,
               sliding_window=single("sliding_window", windows),
               layer_types=["full_attention" if w is None else "sliding_attention"
                            for w in windows], **SWIGLU,
               output_router_logits=cfg.moe_aux_loss_coef > 0,
               router_aux_loss_coef=cfg.moe_aux_loss_coef or 0.001)


FAMILY = Family(
    model_type="gpt_oss",
    defaults={"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
              "attention_bias": True, "sliding_window": 128, "num_local_experts": 128,
              "num_experts_per_tok": 4, **SWIGLU},
    hf_tensors=(llama.EMBED_HEAD + llama.ATTENTION + qwen2.QKV_BIAS + (O_BIAS, SINKS)
                + EXPERTS + llama.NORMS),
    export_class="GptOssForCausalLM",
    activations={"silu": "swiglu_clamped"},
    attention_bias=True,
    sinks=True,
    expresses=frozenset({"sinks", "o_bias"}),
    read_keys=read_keys,
    write_keys=write_keys,
)
