"""Tiny random-weight gpt-oss and Llama 4 (text) checkpoints with transformers' own numbers.

Run in the throwaway venv (torch and transformers are never imported by the package or tests):

    /work/goldenvenv/bin/python scripts/make_pretrained_golden_moe.py [--only gpt_oss,llama4_text]

Writes tests/data/pretrained/tiny/<model_type>/ (gpt_oss, llama4_text) in the layout of the other
tiny fixtures (scripts/make_pretrained_golden_tiny.py): config.json + model.safetensors from `save_pretrained`,
cases.json (`{"default": null}`) and logits.npz holding
- `token_ids` [1, L] int32 (L = 40: longer than gpt-oss's window 8, Llama 4's chunk 8 and
  several multiples of its floor_scale 4, so the windowed, chunked and temperature paths are
  all exercised);
- `logits__default` [1, L, V] float32 (one forward, no cache);
- `greedy_prompt` [1, P] int32 and `greedy_new` [1, 32] int32: 32 greedy tokens after the
  first P = 12 tokens, with transformers' KV cache (`generate(do_sample=False)`, EOS ignored);
- `greedy_logits` [1, P + 31, V] float32: the one-shot forward over prompt + new tokens but
  the last (the logits each greedy choice was made from, for a tolerance-aware check);
- `bfloat16_logits` [1, L, V] float32: transformers' logits of the same checkpoint loaded in
  bfloat16 (eager attention): a mixture of experts in bfloat16 may route a token to another
  expert than in float32 (gpt-oss here: position 5, 1.2 away), so bfloat16 is checked against
  transformers' own bfloat16.

Every feature is on, as in the published configs:
- gpt_oss: attention biases (q/k/v/o), learned sinks per head, alternating sliding (window 8) /
  full layers, YaRN factor 32 with `truncate: false` (original context 4096 as published, so
  that the correction range [2.02, 4.35] of the 8 frequencies is fractional: truncating it to
  [2, 5] changes the logits, so the golden tells truncate apart), the clamped
  SwiGLU experts (alpha 1.702, limit 7; the gate/up weights drawn large enough that the clamp
  is hit: the count is printed) with biases, the top-k-then-softmax router with a bias.
- llama4_text: 4 layers, chunked attention (chunk 8) on the RoPE layers, NoPE on every 4th layer
  (the last), QK L2-norm on the RoPE layers, attention temperature tuning (floor_scale 4,
  attn_scale 0.5) on the NoPE layer, llama3 RoPE scaling with low_freq_factor ==
  high_freq_factor (as Llama-4-Scout's config carries), MoE every second layer
  (interleave_moe_layer_step 2: layers 1 and 3; dense layers use intermediate_size_mlp),
  sigmoid top-2 router, a shared expert, experts stored fused (`experts.gate_up_proj`
  [E, D, 2F], `experts.down_proj` [E, F, D]).
Weights are redrawn as in make_pretrained_golden_tiny (normal, std 1/sqrt(fan_in), norms around
1, biases and sinks 0.5 * normal) so that no feature is tested by a zero.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

import numpy as np
import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "pretrained" / "tiny"
VOCAB = 256
SEQ = 40
PROMPT = 12
NEW = 32
COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
          "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
          "tie_word_embeddings": False}
FAMILIES = {
    "gpt_oss": dict(
        COMMON, model_type="gpt_oss", num_hidden_layers=2, intermediate_size=32,
        max_position_embeddings=131072,
        num_local_experts=4, num_experts_per_tok=2, sliding_window=8, attention_bias=True,
        layer_types=["sliding_attention", "full_attention"], swiglu_limit=7.0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096}),
    "llama4_text": dict(
        COMMON, model_type="llama4_text", num_hidden_layers=4, intermediate_size=32,
        intermediate_size_mlp=48, num_local_experts=4, num_experts_per_tok=2,
        interleave_moe_layer_step=2, attention_chunk_size=8, no_rope_layer_interval=4,
        use_qk_norm=True, attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5,
        attention_bias=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                         "original_max_position_embeddings": 16}),
}
# gpt-oss's gate/up weights scaled up so that |gate| or |up| > 7 happens (the clamp is tested)
GATE_UP_SCALE = {"gpt_oss": 4.0, "llama4_text": 1.0}


def _randomize(model: torch.nn.Module, family: str) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif p.ndim == 1 or name.endswith("_bias"):  # biases, sinks, expert biases [X, F]
                p.copy_(0.5 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p))
            elif p.ndim == 3:  # stacked experts [E, in, out]
                scale = GATE_UP_SCALE[family] if "gate_up" in name else 1.0
                p.copy_(scale * torch.randn_like(p) / math.sqrt(p.shape[1]))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]))


def _config(spec: dict) -> transformers.PretrainedConfig:
    spec = dict(spec)
    return transformers.AutoConfig.for_model(spec.pop("model_type"), **spec)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=ids).logits.float().numpy()


def _clamp_hits(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """How many gate/up values gpt-oss's experts clamp on `ids` (so the clamp is exercised)."""
    hits = []
    experts = [layer.mlp.experts for layer in model.model.layers]
    originals = [e._apply_gate for e in experts]

    def counting(original, limit):
        def apply(gate_up):
            hits.append(int((gate_up[..., ::2] > limit).sum() + (gate_up[..., 1::2].abs() > limit).sum()))
            return original(gate_up)
        return apply

    for e, original in zip(experts, originals):
        e._apply_gate = counting(original, e.limit)
    _logits(model, ids)
    for e, original in zip(experts, originals):
        e._apply_gate = original
    return sum(hits)


def write(family: str, ids: torch.Tensor) -> None:
    spec = FAMILIES[family]
    out = OUT / family
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(2000 + sorted(FAMILIES).index(family))
    config = _config(spec)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomize(model, family)
    model.save_pretrained(out, safe_serialization=True)
    arrays = {"token_ids": ids.numpy().astype(np.int32),
              "logits__default": _logits(model, ids)}
    prompt = ids[:, :PROMPT]
    with torch.no_grad():
        seq = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None,
                             pad_token_id=0)
    arrays["greedy_prompt"] = prompt.numpy().astype(np.int32)
    arrays["greedy_new"] = seq[:, PROMPT:].numpy().astype(np.int32)
    arrays["greedy_logits"] = _logits(model, seq[:, :-1])
    # the cached greedy run chose the argmax of the uncached logits (else the golden is fragile)
    np.testing.assert_array_equal(arrays["greedy_logits"][0, PROMPT - 1:].argmax(-1),
                                  arrays["greedy_new"][0])
    again = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager").eval()
    np.testing.assert_allclose(_logits(again, ids), arrays["logits__default"], atol=1e-5, rtol=0)
    half = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.bfloat16, attn_implementation="eager").eval()
    arrays["bfloat16_logits"] = _logits(half, ids)
    np.savez_compressed(out / "logits.npz", **arrays)
    (out / "cases.json").write_text(json.dumps({"default": None}, indent=1) + "\n")
    extra = f", clamp hits {_clamp_hits(model, ids)}" if family == "gpt_oss" else ""
    print(f"tiny/{family}: {sum(p.numel() for p in model.parameters())} parameters,"
          f" layer_types {config.layer_types}{extra}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=",".join(FAMILIES))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(3, VOCAB, size=(1, SEQ)).astype(np.int64))
    for family in args.only.split(","):
        write(family, ids)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
