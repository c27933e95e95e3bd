"""The two real models (GGUF, from scripts/fetch_pretrained.sh) against transformers 5.24's
goldens (tests/data/pretrained/*.npz): float32 logits within 1e-3 at the stored positions, the
same argmax at every position, the same 32-token greedy continuation. Each model is loaded
once per module; skipped, with the reason, when the files are absent. Both run with
`scan_layers=True`: SmolLM2 (one window in every layer) compiles one block instead of 30 (its
greedy test 147 s -> 29 s on a loaded machine, logits unchanged to the last digit); Gemma 3
scans its group of five sliding layers and one global layer three times (18 layers: six
blocks compiled, not 18; tests/model/test_scan_groups.py holds group scan == loop). The loop
meets real weights in tests/pretrained/test_pretrained_yarn.py (SmolLM2's first 4 layers at
10,240 tokens)."""

import dataclasses
import json
import os
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax import pretrained
from posenc_jax.model.generate import generate

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "pretrained"
DIR = pathlib.Path(os.environ.get("POSENC_PRETRAINED_DIR", ROOT / ".pretrained"))
# XLA's optimised compiles: real models run long enough that cheap machine code costs more
# than it saves (tests/conftest.py, CHEAP_COMPILE; measured in docs/test_time.md)
pytestmark = pytest.mark.optimized_compile
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
SCANNED = {"smollm2", "gemma3"}  # the models run with scan_layers=True (the docstring)


@pytest.fixture(scope="module", params=sorted(MODELS))
def real(request):
    path = DIR / MODELS[request.param]
    if not path.is_file():
        pytest.skip(f"{path} absent: run `bash scripts/fetch_pretrained.sh {DIR}` "
                    "(or set POSENC_PRETRAINED_DIR)")
    meta = json.loads((DATA / f"{request.param}.json").read_text())
    lm = pretrained.load(path)
    if request.param in SCANNED:
        lm.model.config = dataclasses.replace(lm.model.config, scan_layers=True)
    return lm, meta, np.load(DATA / f"{request.param}.npz")


@nnx.jit
def compared(model, tokens, topk_indices, rows):
    """What the goldens hold, computed in the program: the argmax at every position, the
    logits at transformers' top-k indices, the full logits at `rows` (not [T, V] to the host:
    1.5 GB for Gemma 3's 1,500 tokens x 262,144)."""
    logits = model(tokens)[0]
    return logits.argmax(-1), jnp.take_along_axis(logits, topk_indices, -1), logits[rows]


def padded(ids: np.ndarray) -> np.ndarray:
    """The ids [T] (or rows [T, k]) followed by zeros up to 16: the two short texts share one
    compiled program (causal: the padding changes no logit before it; the rows past the text
    are dropped)."""
    return np.pad(ids, [(0, max(16 - len(ids), 0))] + [(0, 0)] * (ids.ndim - 1))


def test_logits_and_argmax_equal_transformers(real):
    lm, meta, golden = real
    for text in meta["texts"]:
        ids, topk = golden[f"{text}__ids"], golden[f"{text}__topk_indices"]
        argmax, top, full = (np.asarray(x)[:len(ids)] for x in compared(
            lm.model, jnp.asarray(padded(ids))[None], jnp.asarray(padded(topk)),
            jnp.asarray(meta["full_positions"][text])))
        np.testing.assert_array_equal(argmax, golden[f"{text}__argmax"], err_msg=text)
        np.testing.assert_allclose(top, golden[f"{text}__topk_values"], atol=1e-3, rtol=0)
        np.testing.assert_allclose(full, golden[f"{text}__full_logits"], atol=1e-3, rtol=0)


def test_greedy_continuation_equals_transformers(real):
    lm, meta, _ = real
    for prompt, want in meta["greedy"].items():
        assert lm.tokenizer.encode(prompt) == want["prompt_ids"]
        out = generate(lm.model, jnp.asarray([want["prompt_ids"]]),
                       max_new_tokens=len(want["new_ids"]))
        assert np.asarray(out)[0, len(want["prompt_ids"]):].tolist() == want["new_ids"], prompt
