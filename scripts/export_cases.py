"""The models `pretrained.save` exports for the transformers golden (project venv side).

    python scripts/export_cases.py OUT [CASE ...]       # writes OUT/<case>/ (+ tokens.json)

Each case is a deterministic model, exported into OUT/<case>/ as transformers would load it,
with `tokens.json` beside it (the token ids the golden runs). scripts/make_export_golden.py
(torch + transformers, the throwaway golden venv) calls this first, then records
transformers' logits of each directory and the sha256 of every file it loaded;
tests/pretrained/test_pretrained_export_golden.py exports the same cases again, checks that the files
are byte for byte those transformers saw, and compares our logits with its.

Cases: the tiny family fixtures (tests/data/pretrained/tiny/, loaded with their extended
RoPE where one is named); `trained`, a model as our trainer builds it (configs/tiny.py's
model, params drawn by NumPy's PCG64 so every machine draws the same); `smollm2_yarn`, the
real SmolLM2-135M (GGUF, $POSENC_PRETRAINED_DIR or <repo>/.pretrained) extended with YaRN x2
past its 8,192 positions.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np
from flax import nnx

from posenc_jax.model.transformer import Transformer, TransformerConfig
from posenc_jax.pretrained.gguf import open_gguf
from posenc_jax.pretrained.loader import build
from posenc_jax.pretrained.safetensors_io import open_safetensors
from posenc_jax.pretrained.save import save

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "pretrained" / "tiny"
REAL_DIR = pathlib.Path(os.environ.get("POSENC_PRETRAINED_DIR", ROOT / ".pretrained"))
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
YARN2 = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192,
         "rope_theta": 100000.0}


def _tiny_case(family: str, rope_case: str | None) -> tuple:
    rope = None
    if rope_case is not None:
        rope = json.loads((TINY / family / "cases.json").read_text())[rope_case]
    model, _, hf = build(open_safetensors(TINY / family), rope_scaling=rope, attention="dense")
    tokens = np.load(TINY / family / "logits.npz")["token_ids"]
    return model, hf, tokens, {}


def _trained() -> tuple:
    cfg = TransformerConfig(vocab_size=256, num_layers=2, embed_dim=32, num_heads=2,
                            mlp_dim=64, attention="dense")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    for _, variable in sorted(nnx.to_flat_state(nnx.state(model, nnx.Param)),
                              key=lambda item: str(item[0])):
        value = np.asarray(variable.get_value())
        variable.set_value(value + rng.normal(0.0, 0.2, value.shape).astype(value.dtype))
    tokens = np.random.default_rng(1).integers(0, 256, (1, 32)).astype(np.int32)
    return model, {}, tokens, {"hf_config_base": {"max_position_embeddings": 32}}


def _smollm2_yarn() -> tuple:
    path = REAL_DIR / SMOLLM2
    if not path.is_file():
        raise FileNotFoundError(f"{path}: run `bash scripts/fetch_pretrained.sh {REAL_DIR}`")
    model, _, hf = build(open_gguf(path), rope_scaling=YARN2, attention="dense")
    tokens = np.random.default_rng(2).integers(0, 49152, (1, 48)).astype(np.int32)
    return model, hf, tokens, {}


CASES = {
    "llama": lambda: _tiny_case("llama", None),
    "llama_yarn2": lambda: _tiny_case("llama", "yarn2"),
    "mistral": lambda: _tiny_case("mistral", None),
    "qwen2_yarn2": lambda: _tiny_case("qwen2", "yarn2"),
    "qwen3": lambda: _tiny_case("qwen3", None),
    "gemma3_text": lambda: _tiny_case("gemma3_text", None),
    "phi3": lambda: _tiny_case("phi3", None),
    "phi3_partial_longrope": lambda: _tiny_case("phi3", "partial_longrope"),
    "gemma3_text_linear8": lambda: _tiny_case("gemma3_text", "linear8_full"),
    "qwen3_moe": lambda: _tiny_case("qwen3_moe", None),
    "mixtral_yarn2": lambda: _tiny_case("mixtral", "yarn2"),
    "trained": _trained,
    "smollm2_yarn": _smollm2_yarn,
}


class _Loaded:
    def __init__(self, model, hf):
        self.model, self.hf_config, self.tokenizer = model, hf, None


def export_case(name: str, out: pathlib.Path) -> tuple:
    """Exports case `name` into `out`; -> (the source model, tokens int32 [1, L])."""
    model, hf, tokens, kwargs = CASES[name]()
    save(_Loaded(model, hf), out, **kwargs)
    return model, tokens


def main(argv: list[str]) -> None:
    out, names = pathlib.Path(argv[0]), argv[1:] or list(CASES)
    for name in names:
        _, tokens = export_case(name, out / name)
        (out / name / "tokens.json").write_text(json.dumps(tokens.tolist()))
        print(f"exported {name} -> {out / name}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
