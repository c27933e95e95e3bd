"""Tiny random-weight checkpoints of each family, for scripts/make_pretrained_golden.py.

For every family below: a config.json-like dict, `AutoModelForCausalLM.from_config` under a fixed
torch seed, every parameter redrawn (normal, std 1/sqrt(fan_in); norms around 1, or around 0 for
Gemma's (1 + w) norms) so that no feature is tested by a zero, then
`save_pretrained(..., safe_serialization=True)` into tests/data/pretrained/tiny/<family>/
(llama sharded, with model.safetensors.index.json). Beside it, logits.npz holds
`token_ids` [1, L] int32 and `logits__<case>` [1, L, V] float32 for each case in cases.json
(`{"<case>": rope_parameters or null}`; null = the checkpoint's own config; otherwise the same
weights in a model whose config's `rope_parameters` is replaced by that dict, as
`pretrained.load(dir, rope_scaling=...)` must do), and `logits__<case>__first<n>` [1, n, V]: the
logits of the first n tokens alone, for every case of the families and lengths in PREFIXES (phi3: 16 and 17, on both sides
of its original_max_position_embeddings 16: transformers' LongRoPE takes the short factors when
max(position_ids) + 1 <= 16, else the long ones; the 32-token case is on the long side).
`write_prefixes` adds them (and cases the npz lacks) to an existing fixture alone (reloading it, and checking it still
gives the committed logits first, within 1e-5). The llama fixture also holds a 320-token
byte-level BPE tokenizer.json (trained here, saved by transformers) and tokenizer_ids.json.

Needs torch + transformers: run only through make_pretrained_golden.py in the throwaway venv.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import torch
import transformers
from tokenizers import ByteLevelBPETokenizer

VOCAB = 320
SEQ = 32  # > the sliding windows below (8 / 6) and > phi3's original context (16)
COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "bos_token_id": 1,
          "eos_token_id": 2, "pad_token_id": 0}
YARN2 = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}
FAMILIES = {
    "llama": (dict(COMMON, model_type="llama", num_hidden_layers=2, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
              {"default": None,
               "yarn2": dict(YARN2, rope_theta=10000.0),
               "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 16},
               "linear2": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    "mistral": (dict(COMMON, model_type="mistral", num_hidden_layers=2, sliding_window=8,
                     tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                {"default": None, "yarn2": dict(YARN2, rope_theta=10000.0)}),
    "qwen2": (dict(COMMON, model_type="qwen2", num_hidden_layers=2, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
              {"default": None, "yarn2": dict(YARN2, rope_theta=1000000.0)}),
    "qwen3": (dict(COMMON, model_type="qwen3", num_hidden_layers=2, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
              {"default": None, "yarn2": dict(YARN2, rope_theta=1000000.0)}),
    "gemma3_text": (dict(COMMON, model_type="gemma3_text", num_hidden_layers=3, head_dim=16,
                         num_attention_heads=2, num_key_value_heads=1, sliding_window=6,
                         query_pre_attn_scalar=24, tie_word_embeddings=True,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         rope_parameters={
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}),
                    {"default": None,
                     "linear8_full": {
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0}}}),
    "phi3": (dict(COMMON, model_type="phi3", num_hidden_layers=2, tie_word_embeddings=False,
                  original_max_position_embeddings=16,
                  rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                   "short_factor": [1.0, 1.1, 1.3, 1.6],
                                   "long_factor": [1.0, 1.5, 2.5, 4.0],
                                   "original_max_position_embeddings": 16}),
             {"default": None,
              "partial_longrope": {"rope_type": "longrope", "rope_theta": 10000.0,
                                   "partial_rotary_factor": 0.5, "short_factor": [1.0, 1.2],
                                   "long_factor": [2.0, 5.0],
                                   "original_max_position_embeddings": 16}}),
}
PREFIXES = {"phi3": (16, 17)}
TOKENIZER_TEXTS = ["Hello world!", "  two  spaces\tand a tab\n", "héllo ünïcode ☃ 日本",
                   "def f(x):\n    return x + 1\n"]


def _randomize(model: torch.nn.Module, gemma: bool) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_((0.0 if gemma else 1.0) + 0.3 * torch.randn_like(p))
            elif p.ndim == 1:  # biases
                p.copy_(0.5 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]))


def _config(spec: dict, rope: dict | None) -> transformers.PretrainedConfig:
    spec = dict(spec)
    if rope is not None:
        spec["rope_parameters"] = rope
    model_type = spec.pop("model_type")
    return transformers.AutoConfig.for_model(model_type, **spec)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=ids).logits.float().numpy()


def _tokenizer(out: pathlib.Path, corpus: str) -> None:
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([corpus], vocab_size=VOCAB, min_frequency=2,
                            special_tokens=["<pad>", "<s>", "</s>"])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>",
                                                eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(out)
    loaded = transformers.AutoTokenizer.from_pretrained(out)
    rows = [{"text": t, "ids": loaded(t)["input_ids"],
             "decode": loaded.decode(loaded(t)["input_ids"])} for t in TOKENIZER_TEXTS]
    (out / "tokenizer_ids.json").write_text(json.dumps(
        {"bos_id": loaded.bos_token_id, "eos_id": loaded.eos_token_id, "cases": rows},
        indent=1, ensure_ascii=False) + "\n")


def write_tiny(root: pathlib.Path, corpus: str) -> None:
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(3, VOCAB, size=(1, SEQ)).astype(np.int64))
    for i, (family, (spec, cases)) in enumerate(FAMILIES.items()):
        out = root / "tiny" / family
        out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(1000 + i)
        model = transformers.AutoModelForCausalLM.from_config(_config(spec, None),
                                                              dtype=torch.float32).eval()
        _randomize(model, gemma=family.startswith("gemma"))
        shard = {"max_shard_size": "40KB"} if family == "llama" else {}
        model.save_pretrained(out, safe_serialization=True, **shard)
        state = model.state_dict()
        arrays = {"token_ids": ids.numpy().astype(np.int32)}
        for case, rope in cases.items():
            m = model if rope is None else _with_rope(spec, rope, state)
            arrays[f"logits__{case}"] = _logits(m, ids)
            arrays.update(_prefix_logits(m, ids, family, case))
        # The saved directory, reloaded, must give the same logits (catches a lossy save).
        again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        np.testing.assert_array_equal(_logits(again, ids), arrays["logits__default"])
        np.savez_compressed(out / "logits.npz", **arrays)
        (out / "cases.json").write_text(json.dumps(cases, indent=1) + "\n")
        print(f"tiny/{family}: {sum(p.numel() for p in model.parameters())} parameters,"
              f" cases {list(cases)}", flush=True)
        if family == "llama":
            _tokenizer(out, corpus)


def _with_rope(spec: dict, rope: dict, state: dict) -> torch.nn.Module:
    """The same weights in a model whose config's rope_parameters is `rope`."""
    model = transformers.AutoModelForCausalLM.from_config(_config(spec, rope),
                                                          dtype=torch.float32).eval()
    model.load_state_dict(state)
    return model


def _prefix_logits(model, ids: torch.Tensor, family: str, case: str) -> dict[str, np.ndarray]:
    """`logits__<case>__first<n>` for n in PREFIXES[family]."""
    return {f"logits__{case}__first{n}": _logits(model, ids[:, :n])
            for n in PREFIXES.get(family, ())}


def write_prefixes(root: pathlib.Path) -> None:
    """Adds, to the committed fixtures of the PREFIXES families, the cases and prefix logits
    their npz lacks, leaving the checkpoint and every array already there as it is."""
    for family, lengths in PREFIXES.items():
        out = root / "tiny" / family
        spec, cases = FAMILIES[family]
        arrays = dict(np.load(out / "logits.npz"))
        model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        ids = torch.from_numpy(arrays["token_ids"].astype(np.int64))
        # within float32 summation order (1.7e-6 seen: another machine, thread count)
        np.testing.assert_allclose(_logits(model, ids), arrays["logits__default"], atol=1e-5,
                                   rtol=0)
        new = {}
        for case, rope in cases.items():
            m = model if rope is None else _with_rope(spec, rope, model.state_dict())
            if f"logits__{case}" not in arrays:
                new[f"logits__{case}"] = _logits(m, ids)
            new.update({k: v for k, v in _prefix_logits(m, ids, family, case).items()
                        if k not in arrays})
        np.savez_compressed(out / "logits.npz", **arrays, **new)
        (out / "cases.json").write_text(json.dumps(cases, indent=1) + "\n")
        print(f"tiny/{family}: added {sorted(new)} (prefixes {lengths})", flush=True)
