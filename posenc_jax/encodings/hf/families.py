"""What transformers' model classes do with RoPE beyond the config dict: one record per family.

A config.json does not carry everything: the model class supplies defaults (GPT-NeoX's
`rotary_pct` 0.25, Phi-3's original length 4096, Gemma 3's two thetas) and decides how the
rotation is applied (over the whole head dim, over the first rotary_dim features, or, for
DeepSeek's MLA, over the last qk_rope_head_dim features of an interleaved layout). Each
record says so for the `model_type`s it covers, as read in transformers 5.24's sources.

    apply     "full": cos/sin cover the whole head dim (rotate_half); the default RoPE
              ignores partial_rotary_factor (llama, qwen, gemma, mistral, ...);
              "partial": the first int(D * partial_rotary_factor) features rotate, the rest
              pass through (phi3, gpt_neox, stablelm, phi);
              "mla": DeepSeek: [pass-through qk_nope_head_dim | rotary qk_rope_head_dim]
    mrope     None, "chunked" (Qwen2-VL, Qwen2.5-VL) or "interleaved" (Qwen3-VL, whatever its
              config's mrope_interleaved says)
    per_layer None, "gemma3" or "gemma4": RoPE per `layer_types` entry
    layout    "half" (rotate_half, pairs (i, i + D/2)) or "interleaved": Llama 4's complex
              pairs (2i, 2i + 1) (`view_as_complex`); DeepSeek's MLA says so in its config
    defaults  config keys the class fills in when config.json omits them
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["FAMILIES", "Family", "family_of"]


@dataclasses.dataclass(frozen=True)
class Family:
    apply: str = "full"
    mrope: str | None = None
    per_layer: str | None = None
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    layout: str = "half"


_FULL = Family()
_PARTIAL = Family(apply="partial")
_GEMMA3 = Family(per_layer="gemma3", defaults={
    "head_dim": 256, "hidden_size": 2304, "num_attention_heads": 8, "num_hidden_layers": 26,
    "max_position_embeddings": 131072, "sliding_window_pattern": 6})
_GEMMA4 = Family(per_layer="gemma4", defaults={
    "head_dim": 256, "global_head_dim": 512, "hidden_size": 2304, "num_attention_heads": 8,
    "num_hidden_layers": 30, "max_position_embeddings": 131072,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 1000000.0}}})

FAMILIES: dict[str, Family] = {
    **dict.fromkeys(("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                     "gemma", "gemma2", "granite", "olmo", "olmo2"), _FULL),
    "phi3": Family(apply="partial", defaults={"original_max_position_embeddings": 4096}),
    "phi": _PARTIAL,
    "stablelm": Family(apply="partial", defaults={"partial_rotary_factor": 0.25}),
    "gpt_neox": Family(apply="partial", defaults={"rotary_pct": 0.25}),
    "gemma3": _GEMMA3, "gemma3_text": _GEMMA3,
    "gemma4": _GEMMA4, "gemma4_text": _GEMMA4,
    "qwen2_vl": Family(mrope="chunked", defaults={"mrope_section": [16, 24, 24]}),
    "qwen2_5_vl": Family(mrope="chunked", defaults={"mrope_section": [16, 24, 24]}),
    **dict.fromkeys(("qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"),
                    Family(mrope="interleaved", defaults={"mrope_section": [24, 20, 20]})),
    "qwen2_vl_text": Family(mrope="chunked", defaults={"mrope_section": [16, 24, 24]}),
    "qwen2_5_vl_text": Family(mrope="chunked", defaults={"mrope_section": [16, 24, 24]}),
    "deepseek_v3": Family(apply="mla", defaults={"rope_interleave": True}),
    # GptOssConfig's rope default (when config.json has none): YaRN x32, no truncation
    "gpt_oss": Family(defaults={"rope_theta": 150000.0, "rope_parameters": {
        "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 4096}}),
    **dict.fromkeys(("llama4", "llama4_text"),
                    Family(layout="interleaved", defaults={"rope_theta": 500000.0})),
}


def family_of(model_type: str | None) -> Family | None:
    """The record for `model_type`; None when the config names none or one not mirrored here
    (read generically: cos/sin over rotary_dim, no class defaults)."""
    return FAMILIES.get(model_type) if model_type is not None else None
