"""The permanent fuzz: random valid configs and transformers' inv_freq / attention_scaling.

Model types with different class defaults (llama, qwen2, mistral: whole head dim; phi3,
gpt_neox, stablelm: partial rotary; deepseek_v3: MLA), both config forms (4.x `rope_scaling`
+ top-level keys, 5.x `rope_parameters`), every rope type the model accepts, head dims 32-256
(including 80, 96, 160: not powers of two), several seq_len for dynamic and LongRoPE.
"""

from __future__ import annotations

import copy
import importlib

import numpy as np
from hf_golden_rotate import ROTARY, encode

HEAD_DIMS = [32, 48, 64, 80, 96, 112, 128, 160, 192, 256]
THETAS = [10000.0, 500000.0, 1000000.0, 12345.6, 100.0]
TYPES = {"llama": ["default", "linear", "dynamic", "yarn", "llama3"],
         "qwen2": ["default", "linear", "dynamic", "yarn"],
         "mistral": ["default", "yarn", "llama3"],
         "phi3": ["default", "longrope"],
         "gpt_neox": ["default", "linear", "dynamic"],
         "stablelm": ["default", "linear", "dynamic"],
         "deepseek_v3": ["default", "yarn"]}


def _rope(rng, rope_type, rotary_dim, max_len):
    orig = int(rng.choice([2048, 4096, 8192]))
    factor = float(rng.choice([2.0, 4.0, 8.0, 16.0, 40.0]))
    if rope_type == "default":
        return {}
    if rope_type in ("linear", "dynamic"):
        return {"factor": factor}
    if rope_type == "yarn":
        out = {"factor": factor, "original_max_position_embeddings": orig}
        if rng.random() < 0.5:
            out.update(beta_fast=float(rng.choice([16, 32, 64])), beta_slow=float(rng.choice([1, 2])))
        if rng.random() < 0.4:
            out.update(mscale=float(rng.choice([0.0, 0.707, 1.0])),
                       mscale_all_dim=float(rng.choice([0.0, 0.707, 1.0])))
        if rng.random() < 0.2:
            out["truncate"] = False
        return out
    if rope_type == "llama3":
        return {"factor": factor, "low_freq_factor": 1.0, "high_freq_factor": float(
            rng.choice([2.0, 4.0])), "original_max_position_embeddings": orig}
    r = rotary_dim // 2
    return {"short_factor": [float(1 + 0.02 * i * rng.random()) for i in range(r)],
            "long_factor": [float(1 + 30 * (i / max(r - 1, 1)) ** 2) for i in range(r)]}


def random_config(rng):
    model_type = str(rng.choice(list(TYPES)))
    rope_type = str(rng.choice(TYPES[model_type]))
    d = int(rng.choice(HEAD_DIMS))
    heads = int(rng.choice([4, 8, 16]))
    cfg = {"model_type": model_type, "hidden_size": d * heads, "num_attention_heads": heads,
           "max_position_embeddings": int(rng.choice([4096, 32768, 131072]))}
    theta = float(rng.choice(THETAS))
    prf = 1.0
    if model_type in ("phi3", "gpt_neox", "stablelm") and rng.random() < 0.6:
        prf = float(rng.choice([0.25, 0.5, 0.75]))
    if model_type == "llama" and rope_type == "default" and rng.random() < 0.3:
        prf = 0.5  # ignored by llama's default RoPE
    if model_type == "deepseek_v3":
        cfg.update(qk_rope_head_dim=d, qk_nope_head_dim=128, v_head_dim=128, kv_lora_rank=512,
                   q_lora_rank=None)
    rotary_dim = int(d * prf) if model_type != "llama" else d
    rope = _rope(rng, rope_type, rotary_dim, cfg["max_position_embeddings"])
    if model_type == "phi3":
        cfg["original_max_position_embeddings"] = 4096
    v5 = rng.random() < 0.5
    if model_type == "gpt_neox":
        cfg["rotary_emb_base"] = theta
        if prf != 1.0 or rng.random() < 0.5:
            cfg["rotary_pct"] = prf
        if rope_type != "default":
            cfg["rope_scaling"] = {"rope_type": rope_type, **rope}
        return cfg
    if v5:
        cfg["rope_parameters"] = {"rope_type": rope_type, "rope_theta": theta, **rope}
        if prf != 1.0:
            cfg["rope_parameters"]["partial_rotary_factor"] = prf
    else:
        cfg["rope_theta"] = theta
        if prf != 1.0:
            cfg["partial_rotary_factor"] = prf
        if rope_type != "default":
            key = "type" if rng.random() < 0.3 else "rope_type"
            cfg["rope_scaling"] = {key: rope_type, **rope}
    return cfg


def run(transformers, torch, config, seq_len):
    hf = transformers.AutoConfig.for_model(**copy.deepcopy(config))  # it mutates
    package, cls = ROTARY[config["model_type"]]
    module = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    rotary = getattr(module, cls)(hf)
    if seq_len is not None:
        rotary(torch.zeros(1, 2, 8), torch.tensor([[0, seq_len - 1]]))
    return {"inv_freq": encode(rotary.inv_freq.detach().to(torch.float32).numpy()),
            "attention_factor": float(rotary.attention_scaling)}


def fuzz_goldens(transformers, torch, *, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        config = random_config(rng)
        rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
        kind = rope.get("rope_type", rope.get("type"))
        seq_len = None
        if kind in ("dynamic", "longrope"):
            seq_len = int(rng.choice([100, 4096, 4097, 6000, 20000]))
        record = {"config": config, "seq_len": seq_len}
        try:
            record["hf"] = run(transformers, torch, config, seq_len)
        except Exception as err:  # noqa: BLE001  (record transformers' refusal, whatever it is)
            record["error"] = f"{type(err).__name__}: {err}"[:200]
        out.append(record)
    return out
