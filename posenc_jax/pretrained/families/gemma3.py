"""Gemma 3 (`gemma3_text`, and the multimodal `gemma3`'s text_config): sqrt(E) embeddings,
(1 + w) norms before and after attention and MLP, QK-norm, GeGLU, `query_pre_attn_scalar`,
sliding-window layers set by `layer_types` (five sliding then one full), a RoPE per layer type,
final logit soft-cap if configured.

    model.layers.N.input_layernorm             -> attn_norm.scale
    model.layers.N.pre_feedforward_layernorm   -> mlp_norm.scale
    model.layers.N.post_attention_layernorm    -> post_attn_norm.scale
    model.layers.N.post_feedforward_layernorm  -> post_mlp_norm.scale
    (the rest as Llama's, q / k norms as Qwen3's)

Multimodal checkpoints keep the text model under `model.language_model.` or
`language_model.model.` (the loader finds the prefix) beside a vision tower it ignores.
GGUF (`gemma3`): norms stored as 1 + w; a file without a local rope base gets Gemma 3's
default sliding-layer theta 1e4, the file's `rope.freq_base` going to the full layers.
"""

from __future__ import annotations

from posenc_jax.pretrained.families import llama, qwen3
from posenc_jax.pretrained.families.record import GGUF, Family, Row
from posenc_jax.pretrained.families.transforms import SAME, minus_one

__all__ = ["FAMILY", "LOCAL_ROPE_THETA"]

LOCAL_ROPE_THETA = 10000.0
NORMS = tuple(
    Row(f"{llama.LAYER}{hf}.weight", (("layers", "{i}", ours, "scale"),), SAME)
    for hf, ours in (("input_layernorm", "attn_norm"), ("pre_feedforward_layernorm", "mlp_norm"),
                     ("post_attention_layernorm", "post_attn_norm"),
                     ("post_feedforward_layernorm", "post_mlp_norm")))
_BLOCK = {**llama.GGUF_BLOCK, "ffn_norm": "pre_feedforward_layernorm",
          "post_attention_norm": "post_attention_layernorm",
          "post_ffw_norm": "post_feedforward_layernorm"}


def layer_ropes(config: dict, rope_theta: float) -> None:
    """`layer_types` from the sliding-window pattern (every n-th layer full) and one RoPE per
    layer type: the file's theta for full layers, `LOCAL_ROPE_THETA` for sliding ones."""
    pattern = config["_sliding_window_pattern"]
    config["layer_types"] = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                             for i in range(config["num_hidden_layers"])]
    config["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_ROPE_THETA},
        "full_attention": {"rope_type": "default", "rope_theta": rope_theta}}


FAMILY = Family(
    model_type="gemma3_text",
    aliases=("gemma3",),
    defaults={"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "sliding_window": 4096,
              "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
              "final_logit_softcapping": None, "attn_logit_softcapping": None,
              "vocab_size": 262208, "intermediate_size": 9216, "num_key_value_heads": 4},
    hf_tensors=llama.EMBED_HEAD + llama.ATTENTION + qwen3.QK_NORM + llama.MLP + NORMS,
    export_class="Gemma3ForCausalLM",
    activation_key="hidden_activation",
    activations={"gelu_pytorch_tanh": "geglu"},
    qk_norm=True,
    gemma=True,
    windows="layer_types",
    gguf=GGUF(arch="gemma3",
              keys={**llama.GGUF_KEYS, "attention.key_length": "head_dim",
                    "attention.sliding_window": "sliding_window"},
              defaults={**{k: v for k, v in llama.GGUF_BASE.items() if k != "hidden_act"},
                        "hidden_activation": "gelu_pytorch_tanh",
                        "max_position_embeddings": 131072, "head_dim": 256,
                        "rope_theta": 1_000_000.0, "attention_bias": False,
                        "query_pre_attn_scalar": 256, "sliding_window": 4096,
                        "final_logit_softcapping": None, "attn_logit_softcapping": None,
                        "use_bidirectional_attention": False, "_sliding_window_pattern": 6},
              block=_BLOCK, top=llama.GGUF_TOP,
              fixes={part: minus_one for part in _BLOCK if part.endswith("norm")}
              | {"output_norm": minus_one},
              complete=layer_ropes),
    claims=lambda cfg: cfg.post_norms,
)
