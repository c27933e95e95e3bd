"""Writes tests/data/pretrained/: transformers' own numbers for the pretrained-model tests.

Run in a throwaway venv (never the project's .venv; torch and transformers are never imported
by the package or its tests), from the repository root, after scripts/fetch_pretrained.sh:

    python3 -m venv /work/goldenvenv && /work/goldenvenv/bin/pip install torch==2.13.0 \
        transformers==5.24 gguf accelerate safetensors tokenizers numpy
    /work/goldenvenv/bin/python scripts/make_pretrained_golden.py [--dir DIR] [--only a,b]

Sections (--only; default all), each writing its own files, so one can be redone alone:
* tiny:    tiny/<family>/ (scripts/make_pretrained_golden_tiny.py: llama, mistral, qwen2, qwen3,
           gemma3_text, phi3 random-weight safetensors checkpoints + logits.npz + cases.json).
* tiny_prefixes: only the `logits__default__first<n>` arrays of the committed tiny fixtures
           (`make_pretrained_golden_tiny.write_prefixes`; in "tiny" too).
* smollm2, gemma3: <model>.json and <model>.npz for the real GGUF model, loaded by
  `AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32)`:
    json: `config` (transformers' config.to_diff_dict(), less version and paths), `texts`,
          `full_positions`, `greedy` ({prompt: prompt_ids, new_ids (32 greedy tokens with the KV
          cache, never stopping at EOS), text}), `tokenizer` (AutoTokenizer(gguf_file) on several
          texts: ids with and without special tokens, their decodes, bos/eos ids),
          `tensor_names` (transformers' state-dict names, lm_head.weight left out when tied).
    npz:  `<text>__ids` [L] int32; `<text>__topk_values` [L, 8] float32, `__topk_indices` [L, 8]
          int32, `__argmax` [L] int32 at every position; `<text>__full_logits` [P, V] float32 at
          the positions `full_positions[text]`; `tensor_samples` [N, 16] float32 (each tensor's
          values at flat indices round(linspace(0, size - 1, 16))), `tensor_sum` / `tensor_sumsq`
          [N] float64, in `tensor_names` order.
* yarn (part of the smollm2 run, as the model is loaded once): smollm2_yarn.json/.npz, SmolLM2
  cut to its first 4 decoder layers (+ final norm and tied head) on 10,240 tokens, with
  `rope_parameters` YaRN x2 (original 8192) and without: `<case>__topk_*`, `__argmax` at every
  position, `__full_logits` at positions 8500 and 10239, `<case>__inv_freq` and the json's
  `attention_scaling`.
versions.json records the library versions and the GGUF files' sha256.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import os
import pathlib
import platform
import sysconfig

import accelerate
import gguf
import make_pretrained_golden_tiny
import numpy as np
import safetensors
import tokenizers
import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "pretrained"
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
LONG_TOKENS = 1500
YARN_TOKENS = 10240
YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192,
        "rope_theta": 100000.0}
TOPK = 8
SAMPLES = 16
PROMPTS = ["The capital of France is", "The three primary colors are"]
TOKENIZER_TEXTS = {
    "ascii": "Hello, world! This is a test of the tokenizer.",
    "unicode": "Héllo wörld — naïve café, 日本語のテキスト, emoji 🙂👍🏽, Ελληνικά, русский",
    "code": "def f(x):\n\treturn {'a': [1, 2, 3]}  # comment\n\nclass A:\n    pass\n",
    "whitespace": "  leading\n\n\ntrailing   \t\t  \n    four spaces",
    "digits": "digits 1234567890 and 3.14159, 2**10=1024",
    "specials": "<|im_start|>user\nhi<|im_end|><start_of_turn>model\n<eos>",
}


def _topics() -> str:
    path = pathlib.Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    return path.read_text(encoding="utf-8")


def _texts() -> dict[str, str]:
    topics = _topics()
    start = topics.index("The \"for\" statement")  # prose, past the file's header
    return {"france": PROMPTS[0], "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci",
            "long": topics[start:start + 9000]}


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _record_logits(arrays: dict, key: str, logits: torch.Tensor, positions: list[int]) -> None:
    """logits [L, V] float32 -> top-k, argmax at every position, full rows at `positions`."""
    values, indices = torch.topk(logits, TOPK, dim=-1)
    arrays[f"{key}__topk_values"] = values.numpy().astype(np.float32)
    arrays[f"{key}__topk_indices"] = indices.numpy().astype(np.int32)
    arrays[f"{key}__argmax"] = logits.argmax(-1).numpy().astype(np.int32)
    arrays[f"{key}__full_logits"] = logits[positions].numpy().astype(np.float32)


def _greedy(model, ids: list[int], steps: int = 32) -> list[int]:
    """Greedy decoding with transformers' KV cache; EOS does not stop it (always `steps`)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        cache, new = out.past_key_values, []
        for _ in range(steps):
            tok = int(out.logits[0, -1].argmax())
            new.append(tok)
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
    return new


def _tokenizer_cases(tok) -> dict:
    rows = {}
    for name, text in TOKENIZER_TEXTS.items():
        ids = tok(text)["input_ids"]
        plain = tok(text, add_special_tokens=False)["input_ids"]
        rows[name] = {"text": text, "ids": ids, "ids_no_special": plain,
                      "decode_no_special": tok.decode(plain),
                      "decode_skip_special": tok.decode(ids, skip_special_tokens=True)}
    return {"bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id, "cases": rows,
            **backend_digest(json.loads(tok.backend_tokenizer.to_str()))}


def backend_digest(backend: dict) -> dict:
    """sha256 of the BPE merges ("left right" lines, in rank order) and of the added tokens
    ("id content special" lines, by id) of a tokenizer.json dict, with their counts."""
    merges = "\n".join(" ".join(m) for m in backend["model"]["merges"])
    added = "\n".join(f"{a['id']} {a['content']} {int(a['special'])}"
                      for a in sorted(backend["added_tokens"], key=lambda a: a["id"]))
    return {"merges_sha256": hashlib.sha256(merges.encode()).hexdigest(),
            "merges_count": len(backend["model"]["merges"]),
            "added_sha256": hashlib.sha256(added.encode()).hexdigest(),
            "added_count": len(backend["added_tokens"])}


def _config_dict(config) -> dict:
    d = config.to_diff_dict()
    for k in ("transformers_version", "_name_or_path", "_model_name_or_path"):
        d.pop(k, None)
    return d


def _tensor_stats(model, tied: bool) -> tuple[list[str], dict]:
    names, samples, sums, sumsq = [], [], [], []
    for name, t in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        flat = t.detach().double().reshape(-1).numpy()
        idx = np.round(np.linspace(0, flat.size - 1, SAMPLES)).astype(np.int64)
        names.append(name)
        samples.append(flat[idx].astype(np.float32))
        sums.append(flat.sum())
        sumsq.append((flat * flat).sum())
    return names, {"tensor_samples": np.stack(samples), "tensor_sum": np.array(sums),
                   "tensor_sumsq": np.array(sumsq)}


def real_model(key: str, directory: pathlib.Path, yarn: bool) -> None:
    fname = MODELS[key]
    t0 = datetime.datetime.now()
    tok = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=fname)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=fname, dtype=torch.float32).eval()
    print(f"{key}: loaded in {datetime.datetime.now() - t0}", flush=True)
    texts, arrays, positions = _texts(), {}, {}
    for name, text in texts.items():
        ids = tok(text)["input_ids"][:LONG_TOKENS]
        assert name != "long" or len(ids) == LONG_TOKENS, (name, len(ids))
        last = len(ids) - 1
        positions[name] = [last] if name != "long" else (
            [100, 700, last] if key == "smollm2" else [last])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        arrays[f"{name}__ids"] = np.asarray(ids, np.int32)
        _record_logits(arrays, name, logits, positions[name])
        del logits
        print(f"{key}: {name} ({len(ids)} tokens) done {datetime.datetime.now() - t0}", flush=True)
    greedy = {}
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        new = _greedy(model, ids)
        greedy[prompt] = {"prompt_ids": ids, "new_ids": new, "text": tok.decode(new)}
        print(f"{key}: greedy {prompt!r} -> {greedy[prompt]['text']!r}", flush=True)
    tied = bool(model.config.tie_word_embeddings)
    names, stats = _tensor_stats(model, tied)
    arrays.update(stats)
    meta = {"file": fname, "config": _config_dict(model.config), "texts": texts,
            "full_positions": positions, "greedy": greedy, "tokenizer": _tokenizer_cases(tok),
            "tensor_names": names, "sample_count": SAMPLES, "topk": TOPK}
    np.savez_compressed(OUT / f"{key}.npz", **arrays)
    (OUT / f"{key}.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    print(f"{key}: written in {datetime.datetime.now() - t0}", flush=True)
    if yarn:
        yarn_truncated(model, tok, t0)


def yarn_truncated(model, tok, t0) -> None:
    """SmolLM2's first 4 layers at 10,240 tokens, with and without YaRN x2."""
    layers = 4
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    topics = _topics()
    ids = tok(topics)["input_ids"][:YARN_TOKENS]
    assert len(ids) == YARN_TOKENS, len(ids)
    rotary_cls = type(model.model.rotary_emb)
    arrays, meta = {"ids": np.asarray(ids, np.int32)}, {
        "num_hidden_layers": layers, "full_positions": [8500, YARN_TOKENS - 1],
        "cases": {"default": None, "yarn2": YARN}, "attention_scaling": {}}
    for case, rope in meta["cases"].items():
        cfg = copy.deepcopy(model.config)
        if rope is not None:
            cfg.rope_parameters = dict(rope)
        model.model.rotary_emb = rotary_cls(config=cfg)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        _record_logits(arrays, case, logits, meta["full_positions"])
        del logits
        arrays[f"{case}__inv_freq"] = model.model.rotary_emb.inv_freq.double().numpy()
        meta["attention_scaling"][case] = float(model.model.rotary_emb.attention_scaling)
        print(f"yarn: {case} done {datetime.datetime.now() - t0}", flush=True)
    np.savez_compressed(OUT / "smollm2_yarn.npz", **arrays)
    (OUT / "smollm2_yarn.json").write_text(json.dumps(meta, indent=1) + "\n")


def versions(directory: pathlib.Path) -> None:
    files = {f: _sha256(directory / f) for f in MODELS.values() if (directory / f).exists()}
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "gguf": gguf.__version__
            if hasattr(gguf, "__version__") else "unknown", "tokenizers": tokenizers.__version__,
            "numpy": np.__version__, "accelerate": accelerate.__version__,
            "safetensors": safetensors.__version__, "gguf_sha256": files,
            "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    (OUT / "versions.json").write_text(json.dumps(info, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.environ.get("POSENC_PRETRAINED_DIR",
                                                    str(ROOT / ".pretrained")))
    ap.add_argument("--only", default="tiny,smollm2,gemma3,yarn")
    args = ap.parse_args()
    only = set(args.only.split(","))
    torch.set_num_threads(2)
    directory = pathlib.Path(args.dir)
    OUT.mkdir(parents=True, exist_ok=True)
    versions(directory)
    if "tiny" in only:
        make_pretrained_golden_tiny.write_tiny(OUT, _topics()[:200_000])
    if "tiny_prefixes" in only and "tiny" not in only:
        make_pretrained_golden_tiny.write_prefixes(OUT)
    if "smollm2" in only:
        real_model("smollm2", directory, yarn="yarn" in only)
    if "gemma3" in only:
        real_model("gemma3", directory, yarn=False)


if __name__ == "__main__":
    main()
