"""Writes tests/data/hf_rope_golden.json: Hugging Face transformers' own RoPE frequencies.

For each config.json-like dict below, builds the model's config class and its rotary-embedding
module exactly as transformers does when it loads a checkpoint, runs the module's forward at a
given sequence length (which triggers transformers' dynamic-NTK / LongRoPE update), and
records `inv_freq` [R] and `attention_scaling`. For MLA models (DeepSeek) it also records the
extra softmax-scale multiplier that the attention layer applies.

The test suite (tests/encodings/test_hf_config.py) compares `posenc_jax.encodings.hf_config.from_hf_config`
with these numbers; it needs neither torch nor transformers. This script does, so run it in a
throwaway environment, never the project's .venv, once per transformers generation; each run
merges its results into the JSON under its own version:

    echo torch==2.13.0 > /tmp/pin.txt      # the CPU build on disk; keeps pip off CUDA wheels
    python3 -m venv /tmp/hfenv && /tmp/hfenv/bin/pip install torch==2.13.0 \
        && /tmp/hfenv/bin/pip install -c /tmp/pin.txt transformers==5.24.0
    python3 -m venv /tmp/hfenv4 && /tmp/hfenv4/bin/pip install torch==2.13.0 \
        && /tmp/hfenv4/bin/pip install -c /tmp/pin.txt transformers==4.57.6
    /tmp/hfenv/bin/python scripts/make_hf_golden.py     # 5.24.0 (rope_scaling + rope_parameters)
    /tmp/hfenv4/bin/python scripts/make_hf_golden.py    # 4.57.6 (rope_scaling)

Cases marked `"since": 5` use the transformers 5.x `rope_parameters` form and are skipped by
4.x (which ignores that key).

Under transformers 5.x the script also writes (scripts/hf_golden_cases.py, _rotate.py, _fuzz.py):
* tests/data/hf_rotate_golden.json: q and k rotated by each model's own rotary module and apply
  function (Gemma 3, Gemma 4, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, DeepSeek-V3, Llama 3.1,
  Phi-3.5-mini, Phi-4-mini, GPT-NeoX defaults), every layer type, both config forms, text
  positions up to 20,000 and image/video position grids;
* tests/data/hf_fuzz_golden.json: 400 random valid configs (two seeds) with the rotary
  module's inv_freq and attention_scaling, or transformers' refusal.
Run from the repository root: `/tmp/hfenv/bin/python scripts/make_hf_golden.py`.
"""

from __future__ import annotations

import copy
import importlib
import json
import pathlib
import sys

import hf_golden_models
from hf_golden_cases import ROTATE_CASES
from hf_golden_fuzz import fuzz_goldens
from hf_golden_models import DEEPSEEK_V3, LLAMA31_8B, PHI35_LONG, PHI35_SHORT
from hf_golden_rotate import rotate_case

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "hf_rope_golden.json"


# name, model_type, config.json dict, sequence lengths (None: as built, before any forward)
CASES = [
    ("llama3.1-8b", "llama", LLAMA31_8B, [None, 131072]),
    ("llama3.2-3b", "llama", {
        "hidden_size": 3072, "num_attention_heads": 24, "head_dim": 128,
        "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
     [None]),
    ("llama3-rope_parameters", "llama", {
        "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                            "rope_theta": 500000.0}, "since": 5},
     [None]),
    ("qwen2.5-7b-yarn", "qwen2", {
        "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
                         "type": "yarn"}},
     [None, 131072]),
    ("qwen2.5-yarn-rope_parameters", "qwen2", {
        "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1000000.0,
                            "original_max_position_embeddings": 32768}, "since": 5},
     [None]),
    ("deepseek-v3", "deepseek_v3", DEEPSEEK_V3, [None]),
    ("deepseek-v2-lite", "deepseek_v2", {
        "hidden_size": 2048, "num_attention_heads": 16, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "kv_lora_rank": 512, "q_lora_rank": None,
        "max_position_embeddings": 163840, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                         "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                         "type": "yarn"}},
     [None]),
    ("deepseek-yarn-mscale-ratio", "deepseek_v3", {
        **DEEPSEEK_V3, "rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "mscale": 1.0,
                                        "mscale_all_dim": 0.8}},
     [None]),
    ("yarn-mscale-without-all-dim", "llama", {
        "hidden_size": 2048, "num_attention_heads": 16, "max_position_embeddings": 65536,
        "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 16.0, "mscale": 2.0,
                         "original_max_position_embeddings": 4096}},
     [None]),
    ("gpt-oss-yarn-no-truncate", "llama", {
        "hidden_size": 2880, "num_attention_heads": 64, "head_dim": 64,
        "max_position_embeddings": 131072, "rope_theta": 150000.0,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn",
                         "truncate": False}},
     [None]),
    ("yarn-explicit-attention-factor", "llama", {
        "hidden_size": 1024, "num_attention_heads": 8, "max_position_embeddings": 32768,
        "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.5,
                         "beta_fast": 16.0, "beta_slow": 2.0,
                         "original_max_position_embeddings": 4096}},
     [None]),
    ("yarn-partial-rotary", "llama", {
        "hidden_size": 2048, "num_attention_heads": 16, "max_position_embeddings": 8192,
        "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 2048}},
     [None]),
    ("yarn-ramp-clamped-high", "llama", {  # correction dim past d - 1: HF clamps to d - 1
        "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
        "max_position_embeddings": 1048576, "rope_theta": 100.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                         "original_max_position_embeddings": 131072}},
     [None]),
    ("yarn-ramp-clamped-low", "llama", {  # correction dim below 0: clamped to 0
        "hidden_size": 512, "num_attention_heads": 8, "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 128}},
     [None]),
    ("phi3.5-mini-longrope", "phi3", {
        "hidden_size": 3072, "num_attention_heads": 32, "num_key_value_heads": 32,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"long_factor": PHI35_LONG, "short_factor": PHI35_SHORT,
                         "type": "longrope"}},
     [None, 4096, 4097, 131072]),
    ("phi4-mini-like-longrope-partial", "phi3", {
        "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
        "rope_scaling": {"long_factor": hf_golden_models.PHI4_LONG,
                         "short_factor": hf_golden_models.PHI4_SHORT, "type": "longrope"}},
     [None, 8192]),
    ("longrope-explicit-attention-factor", "phi3", {
        "hidden_size": 1024, "num_attention_heads": 16, "max_position_embeddings": 16384,
        "original_max_position_embeddings": 2048, "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "attention_factor": 1.25,
                         "short_factor": [1.0 + 0.1 * i for i in range(32)],
                         "long_factor": [2.0 + 0.5 * i for i in range(32)]}},
     [None, 2049]),
    ("linear", "llama", {
        "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 4.0}},
     [None]),
    ("dynamic", "llama", {
        "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     [None, 100, 4096, 4097, 6000, 16384]),
    ("dynamic-head_dim-theta", "llama", {
        "hidden_size": 2048, "num_attention_heads": 16, "head_dim": 64,
        "max_position_embeddings": 2048, "rope_theta": 1000000.0,
        "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
     [None, 2048, 3000, 65536]),
    ("default-llama2", "llama", {
        "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
        "rope_theta": 10000.0},
     [None]),
    ("default-head_dim", "llama", {
        "hidden_size": 2048, "num_attention_heads": 8, "head_dim": 256,
        "max_position_embeddings": 8192, "rope_theta": 10000.0},
     [None]),
    ("default-partial-rotary", "phi3", {
        "hidden_size": 2048, "num_attention_heads": 32, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5},
     [None]),
]

ROTARY_CLASS = {
    "llama": "LlamaRotaryEmbedding", "qwen2": "Qwen2RotaryEmbedding",
    "phi3": "Phi3RotaryEmbedding", "deepseek_v3": "DeepseekV3RotaryEmbedding",
    "deepseek_v2": "DeepseekV2RotaryEmbedding",
}
ATTENTION_CLASS = {"deepseek_v3": "DeepseekV3Attention", "deepseek_v2": "DeepseekV2Attention"}


def _softmax_scale_factor(transformers, model_type, config_json):
    """The MLA attention's softmax scale divided by 1/sqrt(qk_head_dim), on a tiny model."""
    tiny = {**config_json, "hidden_size": 64, "num_attention_heads": 2,
            "num_key_value_heads": 2, "kv_lora_rank": 16,
            "q_lora_rank": None if config_json.get("q_lora_rank") is None else 16}
    config = transformers.AutoConfig.for_model(model_type, **copy.deepcopy(tiny))
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    attn = getattr(module, ATTENTION_CLASS[model_type])(config, layer_idx=0)
    qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
    return float(attn.scaling / qk_head_dim ** -0.5)


def run_case(transformers, torch, model_type, config_json, seq_len):
    # transformers mutates the dicts it is given (rope_scaling gains keys): hand it a copy
    config = transformers.AutoConfig.for_model(model_type, **copy.deepcopy(config_json))
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    rotary = getattr(module, ROTARY_CLASS[model_type])(config)
    if seq_len is not None:
        # forward() applies transformers' length-dependent update with seq_len = max(pos) + 1
        position_ids = torch.tensor([[0, seq_len - 1]])
        rotary(torch.zeros(1, 2, 8), position_ids)
    inv_freq = rotary.inv_freq.detach().to(torch.float32).cpu().numpy()
    return {"inv_freq": [float(v) for v in inv_freq],
            "attention_factor": float(rotary.attention_scaling)}


def main():
    import torch
    import transformers

    version = transformers.__version__
    major = int(version.split(".")[0])
    data = json.loads(OUT.read_text()) if OUT.exists() else {"cases": {}, "versions": {}}
    data["versions"][version] = {"torch": torch.__version__}
    for name, model_type, config_json, seq_lens in CASES:
        config_json = dict(config_json)
        since = config_json.pop("since", 4)
        entry = data["cases"].setdefault(name, {})
        entry["model_type"] = model_type
        entry["config"] = config_json
        results = entry.setdefault("hf", {})
        if major < since:
            results.pop(version, None)
            continue
        per_len = {}
        try:
            for seq_len in seq_lens:
                per_len["none" if seq_len is None else str(seq_len)] = run_case(
                    transformers, torch, model_type, config_json, seq_len)
        except (ValueError, KeyError, TypeError) as err:  # this version refuses the config
            results[version] = {"error": f"{type(err).__name__}: {err}"[:300]}
            print(f"{version:>8} {name:<36} refused: {err!s:.100}", file=sys.stderr)
            continue
        record = {"by_seq_len": per_len}
        if model_type in ATTENTION_CLASS:
            record["softmax_scale_factor"] = _softmax_scale_factor(
                transformers, model_type, config_json)
        results[version] = record
        first = per_len["none"]
        print(f"{version:>8} {name:<36} R={len(first['inv_freq']):<3} "
              f"attention_factor={first['attention_factor']:.6f}", file=sys.stderr)
    data["note"] = ("Written by scripts/make_hf_golden.py from transformers' own rotary "
                    "embedding modules; keys of by_seq_len are the sequence length passed to "
                    "the module's forward (max(position_ids) + 1), 'none' = as constructed.")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    if major >= 5:
        write_rotate_and_fuzz(transformers, torch)


def write_rotate_and_fuzz(transformers, torch):
    """tests/data/hf_rotate_golden.json and tests/data/hf_fuzz_golden.json (transformers 5.x)."""
    meta = {"transformers": transformers.__version__, "torch": torch.__version__}
    cases = {}
    for name, config_json, kind in ROTATE_CASES:
        try:
            cases[name] = {"config": config_json, "kind": kind,
                           **rotate_case(transformers, torch, name, config_json, kind)}
        except Exception as err:  # noqa: BLE001  (a refusal is a result too)
            cases[name] = {"config": config_json, "kind": kind,
                           "error": f"{type(err).__name__}: {err}"[:300]}
        print(f"rotate {name:<36} {sorted(cases[name].get('layers', {})) or cases[name]['error']}",
              file=sys.stderr)
    rotate_out = OUT.parent / "hf_rotate_golden.json"
    rotate_out.write_text(json.dumps({**meta, "note": ROTATE_NOTE, "cases": cases}) + "\n")
    fuzz = [r for seed in (0, 1) for r in fuzz_goldens(transformers, torch, n=200, seed=seed)]
    fuzz_out = OUT.parent / "hf_fuzz_golden.json"
    fuzz_out.write_text(json.dumps({**meta, "cases": fuzz}) + "\n")
    print(f"fuzz: {len(fuzz)} configs, {sum('error' in r for r in fuzz)} refused by "
          "transformers", file=sys.stderr)


ROTATE_NOTE = ("Written by scripts/make_hf_golden.py: each model's own rotary module and apply "
               "function on q [B, L, 2, D] and k [B, L, 1, D] drawn as float32 from "
               "numpy.random.default_rng(seed).standard_normal (q first); q_rot / k_rot / "
               "inv_freq are little-endian float32, base64.")


if __name__ == "__main__":
    main()
