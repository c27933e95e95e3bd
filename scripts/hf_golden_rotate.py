"""Rotation goldens and the permanent fuzz for scripts/make_hf_golden.py (transformers 5.x only).

`rotate_goldens` runs each model's own rotary module and apply function (as its attention
layer calls them) on q/k drawn from numpy's default_rng(seed) -- the tests redraw them from the
seed, so only the outputs are stored (float32, base64). `fuzz_goldens` draws random valid
configs (both config forms, every rope type, head dims 32-256, partial rotary, several
seq_len) and records the rotary module's inv_freq and attention_scaling, or its refusal.
"""

from __future__ import annotations

import base64
import copy
import importlib
import zlib

import numpy as np
from hf_golden_cases import LONG, SHORT

ROTARY = {
    "gemma3_text": ("gemma3", "Gemma3RotaryEmbedding"),
    "gemma4_text": ("gemma4", "Gemma4TextRotaryEmbedding"),
    "qwen2_vl_text": ("qwen2_vl", "Qwen2VLRotaryEmbedding"),
    "qwen2_5_vl_text": ("qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding"),
    "qwen3_vl_text": ("qwen3_vl", "Qwen3VLTextRotaryEmbedding"),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3RotaryEmbedding"),
    "llama": ("llama", "LlamaRotaryEmbedding"), "qwen2": ("qwen2", "Qwen2RotaryEmbedding"),
    "mistral": ("mistral", "MistralRotaryEmbedding"), "phi3": ("phi3", "Phi3RotaryEmbedding"),
    "gpt_neox": ("gpt_neox", "GPTNeoXRotaryEmbedding"),
    "stablelm": ("stablelm", "StableLmRotaryEmbedding"),
}
H, K = 2, 1


def encode(a) -> str:
    return base64.b64encode(np.ascontiguousarray(a, "<f4").tobytes()).decode()


def seed_of(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def positions(kind: str) -> np.ndarray:
    """[1, L] text positions, [2, L] (batch-max quirk) or [3, 1, L] multimodal positions."""
    if kind in ("long", "short"):
        return np.array([LONG if kind == "long" else SHORT], np.int64)
    if kind == "batch":  # row 0 stays short, row 1 goes long: the batch max decides for both
        return np.array([SHORT, LONG], np.int64)
    s, axes = 18990, [[], [], []]

    def text(n):
        nonlocal s
        for _ in range(n):
            for a in axes:
                a.append(s)
            s += 1

    def grid(t, h, w, t_step=1):
        nonlocal s
        for ti in range(t):
            for hi in range(h):
                for wi in range(w):
                    axes[0].append(s + ti * t_step)
                    axes[1].append(s + hi)
                    axes[2].append(s + wi)
        s = max(max(a) for a in axes) + 1

    text(4)
    grid(1, 2, 3)            # an image: 2 x 3 merged patches
    text(2)
    grid(2, 2, 2, t_step=50)  # a video: 2 frames, temporal positions 50 apart (Qwen2.5-VL)
    text(2)
    return np.array(axes, np.int64)[:, None, :]


def _module(model_type):
    package, cls = ROTARY[model_type]
    module = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    return module, getattr(module, cls)


def _head_dims(config_json, text, layer_type):
    flat = {**config_json, **config_json.get("text_config", {})}
    if text.model_type == "deepseek_v3":
        return text.qk_nope_head_dim + text.qk_rope_head_dim
    if text.model_type == "gemma4_text" and layer_type == "full_attention":
        return flat.get("global_head_dim", 512)
    if text.model_type == "gemma4_text":
        return flat.get("head_dim", 256)
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def _apply(module, text, q, k, cos, sin):
    """q [B, H, L, D], k [B, K, L, D] as the model's attention layer rotates them."""
    if text.model_type == "deepseek_v3":
        nope = text.qk_nope_head_dim
        fn = (module.apply_rotary_pos_emb_interleave if text.rope_interleave
              else module.apply_rotary_pos_emb)
        q_rot, k_rot = fn(q[..., nope:], k[..., nope:], cos, sin)
        import torch
        return (torch.cat((q[..., :nope], q_rot), dim=-1),
                torch.cat((k[..., :nope], k_rot), dim=-1))
    if text.model_type == "gemma4_text":  # one tensor at a time, [B, L, heads, D]
        return (module.apply_rotary_pos_emb(q.transpose(1, 2), cos, sin, 2).transpose(1, 2),
                module.apply_rotary_pos_emb(k.transpose(1, 2), cos, sin, 2).transpose(1, 2))
    return module.apply_rotary_pos_emb(q, k, cos, sin)


def rotate_case(transformers, torch, name, config_json, kind):
    config = transformers.AutoConfig.for_model(**copy.deepcopy(config_json))  # it mutates
    text = config.get_text_config()
    module, rotary_cls = _module(text.model_type)
    rotary = rotary_cls(text)
    types = sorted(set(text.layer_types)) if text.model_type.startswith("gemma") else [None]
    pos = positions(kind)
    out = {"positions": pos.tolist(), "layers": {}}
    for layer_type in types:
        d = _head_dims(config_json, text, layer_type)
        b, length = pos.shape[-2], pos.shape[-1]
        rng = np.random.default_rng(seed_of(name, layer_type))
        q = rng.standard_normal((b, length, H, d)).astype(np.float32)
        k = rng.standard_normal((b, length, K, d)).astype(np.float32)
        x = torch.zeros(1, dtype=torch.float32)
        args = (x, torch.tensor(pos)) + ((layer_type,) if layer_type else ())
        cos, sin = rotary(*args)
        qt = torch.tensor(q).transpose(1, 2)
        kt = torch.tensor(k).transpose(1, 2)
        q_rot, k_rot = _apply(module, text, qt, kt, cos, sin)
        inv = getattr(rotary, f"{layer_type}_inv_freq" if layer_type else "inv_freq")
        scaling = getattr(rotary, f"{layer_type}_attention_scaling" if layer_type
                          else "attention_scaling")
        out["layers"][layer_type or "-"] = {
            "head_dim": d, "seed": seed_of(name, layer_type), "inv_freq": encode(inv),
            "attention_factor": float(scaling),
            "q_rot": encode(q_rot.transpose(1, 2).numpy()),
            "k_rot": encode(k_rot.transpose(1, 2).numpy())}
    return out
