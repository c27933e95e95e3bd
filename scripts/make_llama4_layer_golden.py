"""Golden outputs of transformers' own Llama 4 text attention layers (throwaway venv only).

    /work/goldenvenv/bin/python scripts/make_llama4_layer_golden.py   # -> tests/data/llama4_layer_golden.npz

Two `Llama4TextAttention` layers of a tiny `Llama4TextConfig` (eager attention, float32):
layer 0 uses RoPE (interleaved complex pairs, theta 10000) and the QK L2-norm
(`use_qk_norm`); layer 1 is a NoPE layer with the query temperature
(`attn_temperature_tuning`, floor_scale 3, attn_scale 0.5, so it varies within 11 tokens).
Causal mask, no chunks (the chunked mask is the attention side's golden). Saved: the
hidden states [B, L, E], each layer's q/k/v/o weights in torch layout and its output.
tests/model/test_llama4_golden.py loads our Attention with these weights and compares.
"""

import pathlib

import numpy as np
import torch
import transformers
from transformers.models.llama4 import modeling_llama4 as m

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "llama4_layer_golden.npz"
B, L, E, H, K, D = 2, 11, 32, 4, 2, 8


def main() -> None:
    torch.manual_seed(0)
    cfg = transformers.Llama4TextConfig(
        hidden_size=E, num_attention_heads=H, num_key_value_heads=K, head_dim=D,
        num_hidden_layers=2, no_rope_layers=[1, 0], use_qk_norm=True,
        attn_temperature_tuning=True, floor_scale=3, attn_scale=0.5, rms_norm_eps=1e-5,
        intermediate_size=16, intermediate_size_mlp=16, vocab_size=32, rope_theta=10000.0,
        attention_chunk_size=None)
    cfg._attn_implementation = "eager"
    hidden = torch.randn(B, L, E)
    position_ids = torch.arange(L)[None].expand(B, L)
    freqs = m.Llama4TextRotaryEmbedding(cfg)(hidden, position_ids)
    mask = torch.full((L, L), float("-inf")).triu(1)[None, None].expand(B, 1, L, L)
    out = {"hidden": hidden.numpy(), "transformers": np.array(transformers.__version__)}
    for i in range(2):
        attn = m.Llama4TextAttention(cfg, i).eval()
        for p in attn.parameters():
            torch.nn.init.normal_(p, std=0.3)
        with torch.no_grad():
            y, _ = attn(hidden, freqs, mask)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"layer{i}_{name}"] = getattr(attn, name).weight.detach().numpy()
        out[f"layer{i}_out"] = y.numpy()
        out[f"layer{i}_use_rope"] = np.array(bool(attn.use_rope))
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} (transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
