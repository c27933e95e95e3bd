"""Tiny random-weight MoE checkpoints for tests/pretrained/test_pretrained_moe.py and the
tiny-family tests: tests/data/pretrained/tiny/{qwen3_moe,mixtral}/.

Qwen3-MoE: three layers (0 and 2 sparse, 1 dense through `mlp_only_layers`), 4 experts, top 2
renormalised (`norm_topk_prob`, as Qwen3-30B-A3B). Mixtral: two layers of 4 experts, top 2,
a sliding window of 8. Made as scripts/make_pretrained_golden_tiny.py makes the
dense families (fixed torch seed, every param redrawn with std 1/sqrt(fan in), norms around 1),
saved with `save_pretrained` (transformers 5 writes one tensor per expert), reloaded and checked
to give the same logits. logits.npz: `token_ids` [1, 32], `logits__<case>` [1, 32, V] for each
case of cases.json, `greedy_prompt` [1, 8] and `greedy_tokens` [1, 24] (`generate`, greedy, 16
new tokens with the cache, no EOS stop).

    /work/goldenvenv/bin/python scripts/make_moe_golden_tiny.py [--dir tests/data/pretrained]
        [--only qwen3_moe,mixtral]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

import make_pretrained_golden_tiny as tiny
import numpy as np
import torch
import transformers

SPEC = dict(tiny.COMMON, model_type="qwen3_moe", num_hidden_layers=3, tie_word_embeddings=False,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[1],
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
MIXTRAL = dict(tiny.COMMON, model_type="mixtral", num_hidden_layers=2, tie_word_embeddings=False,
               num_local_experts=4, num_experts_per_tok=2, intermediate_size=16, sliding_window=8,
               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
CASES = {"default": None, "yarn2": dict(tiny.YARN2, rope_theta=1000000.0)}
FAMILIES = {"qwen3_moe": (SPEC, 2000), "mixtral": (MIXTRAL, 2001)}


def _randomize(model: torch.nn.Module) -> None:
    """Norms around 1, embeddings N(0, 1), every other weight N(0, 1 / fan in) (the stacked
    experts [X, out, in] by their last axis)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))


def write(root: pathlib.Path, family: str) -> None:
    spec, seed = FAMILIES[family]
    out = root / "tiny" / family
    out.mkdir(parents=True, exist_ok=True)
    ids = torch.from_numpy(np.random.default_rng(0).integers(
        3, tiny.VOCAB, size=(1, tiny.SEQ)).astype(np.int64))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny._config(spec, None),
                                                          dtype=torch.float32).eval()
    _randomize(model)
    model.save_pretrained(out, safe_serialization=True)
    arrays = {"token_ids": ids.numpy().astype(np.int32)}
    for case, rope in CASES.items():
        m = model if rope is None else tiny._with_rope(spec, rope, model.state_dict())
        arrays[f"logits__{case}"] = tiny._logits(m, ids)
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    np.testing.assert_array_equal(tiny._logits(again, ids), arrays["logits__default"])
    prompt = ids[:, :8]
    with torch.no_grad():
        greedy = model.generate(prompt, max_new_tokens=16, do_sample=False, min_new_tokens=16,
                                eos_token_id=None, pad_token_id=0)
    arrays["greedy_prompt"] = prompt.numpy().astype(np.int32)
    arrays["greedy_tokens"] = greedy.numpy().astype(np.int32)
    np.savez_compressed(out / "logits.npz", **arrays)
    (out / "cases.json").write_text(json.dumps(CASES, indent=1) + "\n")
    print(f"tiny/{family}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="tests/data/pretrained")
    parser.add_argument("--only", default=",".join(FAMILIES))
    args = parser.parse_args()
    for name in args.only.split(","):
        write(pathlib.Path(args.dir), name)
