"""Model configs for scripts/make_hf_golden.py's rotation goldens (tests/data/hf_rotate_golden.json).

Published config.json values (the RoPE-relevant keys, plus what transformers' config classes
need to build), in both forms where transformers 5.x accepts both: "legacy" (4.x keys:
rope_theta / rope_scaling / rope_local_base_freq, flat or under text_config) and "v5"
(rope_parameters, keyed by layer type for per-layer models). Honest notes:

* gemma-4 e2b / 26b-a4b: the published config.json files were not at hand offline. The
  values below are transformers 5.24's Gemma4TextConfig defaults ("similar to
  google/gemma-4-e2b-it" says its docstring: head_dim 256, global_head_dim 512, sliding
  theta 1e4, full_attention proportional with partial_rotary_factor 0.25 and theta 1e6),
  with widths, layer counts and kv heads as we recall them (26b-a4b: 2 global kv heads with
  attention_k_eq_v, which the 5.24 sources mention). The RoPE semantics tested (proportional,
  global_head_dim, per-layer dicts) come from transformers' own modules either way.
* Phi-4-mini: partial_rotary_factor 0.75 (rotary dim 96) and LongRoPE as published, but
  the 48-entry factor lists are synthetic (monotone, realistic shape), not the published ones.
"""

from __future__ import annotations

from hf_golden_models import DEEPSEEK_V3, LLAMA31_8B, PHI4_LONG, PHI4_SHORT, PHI35_LONG, PHI35_SHORT


def _gemma3_types(n: int, pattern: int = 6) -> list[str]:
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]


def _gemma4_types(n: int, pattern: int) -> list[str]:
    types = _gemma3_types(n, pattern)
    types[-1] = "full_attention"
    return types


GEMMA3_1B = {"model_type": "gemma3_text", "head_dim": 256, "hidden_size": 1152,
             "intermediate_size": 6912, "num_attention_heads": 4, "num_key_value_heads": 1,
             "num_hidden_layers": 26, "max_position_embeddings": 32768, "rope_theta": 1000000,
             "rope_local_base_freq": 10000, "rope_scaling": None, "sliding_window": 512,
             "sliding_window_pattern": 6, "query_pre_attn_scalar": 256, "vocab_size": 262144}
GEMMA3_4B_TEXT = {"head_dim": 256, "hidden_size": 2560, "intermediate_size": 10240,
                  "model_type": "gemma3_text", "num_attention_heads": 8, "num_hidden_layers": 34,
                  "num_key_value_heads": 4, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                  "sliding_window": 1024}
GEMMA3_27B_TEXT = {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                   "model_type": "gemma3_text", "num_attention_heads": 32,
                   "num_hidden_layers": 62, "num_key_value_heads": 16,
                   "query_pre_attn_scalar": 168,
                   "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}


def _gemma3_v5(text: dict, *, theta_full=1e6, theta_local=1e4) -> dict:
    out = {k: v for k, v in text.items() if k not in ("rope_scaling", "rope_theta",
                                                       "rope_local_base_freq")}
    full = {"rope_type": "default", "rope_theta": theta_full}
    if text.get("rope_scaling"):
        full.update(text["rope_scaling"])
    out["rope_parameters"] = {"sliding_attention": {"rope_type": "default",
                                                    "rope_theta": theta_local},
                              "full_attention": full}
    out["layer_types"] = _gemma3_types(text["num_hidden_layers"],
                                       text.get("sliding_window_pattern", 6))
    return out


GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                  "rope_theta": 1000000.0}}
GEMMA4_E2B_TEXT = {"model_type": "gemma4_text", "hidden_size": 1536, "intermediate_size": 6144,
                   "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
                   "global_head_dim": 512, "num_hidden_layers": 35,
                   "max_position_embeddings": 131072, "sliding_window": 512,
                   "rope_parameters": GEMMA4_ROPE, "layer_types": _gemma4_types(35, 5)}
GEMMA4_26B_TEXT = {"model_type": "gemma4_text", "hidden_size": 2816, "intermediate_size": 2112,
                   "num_attention_heads": 16, "num_key_value_heads": 8,
                   "num_global_key_value_heads": 2, "attention_k_eq_v": True, "head_dim": 256,
                   "global_head_dim": 512, "num_hidden_layers": 30,
                   "max_position_embeddings": 262144, "sliding_window": 1024,
                   "enable_moe_block": True, "num_experts": 128, "top_k_experts": 8,
                   "moe_intermediate_size": 704, "rope_parameters": GEMMA4_ROPE,
                   "layer_types": _gemma4_types(30, 6)}

QWEN2_VL_7B = {"model_type": "qwen2_vl", "hidden_size": 3584, "intermediate_size": 18944,
               "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
               "max_position_embeddings": 32768, "rope_theta": 1000000.0,
               "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
               "vocab_size": 152064}
QWEN25_VL_3B = {"model_type": "qwen2_5_vl", "hidden_size": 2048, "intermediate_size": 11008,
                "num_attention_heads": 16, "num_key_value_heads": 2, "num_hidden_layers": 36,
                "max_position_embeddings": 128000, "rope_theta": 1000000.0,
                "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                "vocab_size": 151936}
QWEN25_VL_7B = {**QWEN25_VL_3B, "hidden_size": 3584, "intermediate_size": 18944,
                "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
                "vocab_size": 152064}
QWEN3_VL_4B_TEXT = {"model_type": "qwen3_vl_text", "head_dim": 128, "hidden_size": 2560,
                    "intermediate_size": 9728, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "num_hidden_layers": 36,
                    "max_position_embeddings": 262144, "rope_theta": 5000000,
                    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                     "rope_type": "default"}, "vocab_size": 151936}
QWEN3_VL_8B_TEXT = {**QWEN3_VL_4B_TEXT, "hidden_size": 4096, "intermediate_size": 12288}


def _qwen_vl_v5(flat: dict, text_type: str) -> dict:
    text = {k: v for k, v in flat.items() if k not in ("model_type", "rope_scaling",
                                                       "rope_theta")}
    rope = {k: v for k, v in flat["rope_scaling"].items() if k != "type"}
    rope.setdefault("rope_type", "default")
    rope["rope_theta"] = flat["rope_theta"]
    return {"model_type": flat["model_type"],
            "text_config": {**text, "model_type": text_type, "rope_parameters": rope}}


PHI4_MINI = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
             "num_attention_heads": 24, "num_key_value_heads": 8, "num_hidden_layers": 32,
             "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
             "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
             "rope_scaling": {"long_factor": PHI4_LONG, "short_factor": PHI4_SHORT,
                              "type": "longrope"}}
PHI35_MINI = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
              "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
              "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
              "rope_theta": 10000.0, "rope_scaling": {"long_factor": PHI35_LONG,
                                                      "short_factor": PHI35_SHORT,
                                                      "type": "longrope"}}

LONG = [0, 1, 2, 3, 7, 100, 1000, 4095, 4096, 4097, 5000, 8191, 12345, 16384, 19999, 20000]
SHORT = [0, 1, 2, 5, 17, 100, 511, 512, 1000, 2047, 2048, 3000, 4000, 4094, 4095, 4095]

# name, config, position kind ("long", "short", "mrope"), per-layer? (layer types read from HF)
ROTATE_CASES = [
    ("gemma-3-1b/legacy", GEMMA3_1B, "long"),
    ("gemma-3-1b/v5", _gemma3_v5(GEMMA3_1B), "long"),
    ("gemma-3-4b/legacy", {"model_type": "gemma3", "text_config": GEMMA3_4B_TEXT}, "long"),
    ("gemma-3-4b/v5", {"model_type": "gemma3", "text_config": _gemma3_v5(
        {**GEMMA3_4B_TEXT, "num_hidden_layers": 34})}, "long"),
    ("gemma-3-27b/legacy", {"model_type": "gemma3", "text_config": GEMMA3_27B_TEXT}, "long"),
    ("gemma-3-27b/v5", {"model_type": "gemma3", "text_config": _gemma3_v5(GEMMA3_27B_TEXT)},
     "long"),
    ("gemma-4-e2b/v5", {"model_type": "gemma4", "text_config": GEMMA4_E2B_TEXT}, "long"),
    ("gemma-4-26b-a4b/v5", {"model_type": "gemma4", "text_config": GEMMA4_26B_TEXT}, "long"),
    ("gemma-4-e2b/text-only", GEMMA4_E2B_TEXT, "long"),
    ("qwen2-vl-7b/legacy", QWEN2_VL_7B, "mrope"),
    ("qwen2-vl-7b/v5", _qwen_vl_v5(QWEN2_VL_7B, "qwen2_vl_text"), "mrope"),
    ("qwen2.5-vl-3b/legacy", QWEN25_VL_3B, "mrope"),
    ("qwen2.5-vl-3b/v5", _qwen_vl_v5(QWEN25_VL_3B, "qwen2_5_vl_text"), "mrope"),
    ("qwen2.5-vl-7b/legacy", QWEN25_VL_7B, "mrope"),
    ("qwen2.5-vl-7b/text-positions", QWEN25_VL_7B, "long"),
    ("qwen3-vl-4b/legacy", {"model_type": "qwen3_vl", "text_config": QWEN3_VL_4B_TEXT}, "mrope"),
    ("qwen3-vl-4b/v5", {"model_type": "qwen3_vl", "text_config": {
        **{k: v for k, v in QWEN3_VL_4B_TEXT.items() if k not in ("rope_scaling", "rope_theta")},
        "rope_parameters": {**QWEN3_VL_4B_TEXT["rope_scaling"], "rope_theta": 5000000.0}}},
     "mrope"),
    ("qwen3-vl-8b/legacy", {"model_type": "qwen3_vl", "text_config": QWEN3_VL_8B_TEXT}, "mrope"),
    ("qwen3-vl-4b/interleaved-false", {"model_type": "qwen3_vl", "text_config": {
        **QWEN3_VL_4B_TEXT, "rope_scaling": {**QWEN3_VL_4B_TEXT["rope_scaling"],
                                             "mrope_interleaved": False}}}, "mrope"),
    ("deepseek-v3/legacy", {"model_type": "deepseek_v3", **DEEPSEEK_V3}, "long"),
    ("deepseek-v3/rope_interleave-null", {"model_type": "deepseek_v3", **DEEPSEEK_V3,
                                          "rope_interleave": None}, "long"),
    ("deepseek-v3/v5", {"model_type": "deepseek_v3", **{
        k: v for k, v in DEEPSEEK_V3.items() if k not in ("rope_scaling", "rope_theta")},
        "rope_parameters": {**{k: v for k, v in DEEPSEEK_V3["rope_scaling"].items()
                               if k != "type"}, "rope_type": "yarn", "rope_theta": 10000.0}},
     "long"),
    ("deepseek-yarn-mscale-0", {"model_type": "deepseek_v3", **DEEPSEEK_V3, "rope_scaling": {
        **DEEPSEEK_V3["rope_scaling"], "mscale": 0.0, "mscale_all_dim": 1.0}}, "long"),
    ("llama-3.1-8b/legacy", {"model_type": "llama", **LLAMA31_8B}, "long"),
    ("llama-3.1-8b/v5", {"model_type": "llama", **{
        k: v for k, v in LLAMA31_8B.items() if k not in ("rope_scaling", "rope_theta")},
        "rope_parameters": {**LLAMA31_8B["rope_scaling"], "rope_theta": 500000.0}}, "long"),
    ("llama-partial-ignored", {"model_type": "llama", "hidden_size": 1024,
                               "num_attention_heads": 8, "max_position_embeddings": 4096,
                               "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, "long"),
    ("phi-3.5-mini/long", PHI35_MINI, "long"),
    ("phi-3.5-mini/short", PHI35_MINI, "short"),
    ("phi-3.5-mini/batch-max", PHI35_MINI, "batch"),
    ("phi-3-no-top-level-original", {**{k: v for k, v in PHI35_MINI.items()
                                        if k != "original_max_position_embeddings"},
                                     "max_position_embeddings": 131072}, "short"),
    ("phi-4-mini/long", PHI4_MINI, "long"),
    ("phi-4-mini/short", PHI4_MINI, "short"),
    ("gpt-neox-defaults", {"model_type": "gpt_neox", "hidden_size": 2048,
                           "num_attention_heads": 16, "max_position_embeddings": 2048,
                           "rope_theta": 5000.0, "rotary_emb_base": 20000}, "short"),
]
