"""SmolLM2 (context 8192) extended with YaRN x2 in one argument of `pretrained.load`, past its
original context, against transformers 5.24 given the same `rope_parameters` (golden:
scripts/make_pretrained_golden.py, 10,240 tokens). To keep CI cheap the golden and this test use
the first 4 decoder layers, then the final norm and the head: the RoPE at positions past 8192
is what is under test, and every layer applies the same one. The test runs the golden's first
LENGTH = 8704 tokens (512 past 8192; the model is causal, so each of those logits is the
10,240-token run's): its full logits at position 8500 and the argmax at every position (the
golden's last position, 10239, costs 18 % more tokens and 38 % more attention on 2 cores).
(The golden also holds the unscaled model; checked by hand it is not asserted here: ~100 s a
case on 2 cores.)"""

from __future__ import annotations

import json
import os
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax import pretrained

# XLA's optimised compiles: real models run long enough that cheap machine code costs more
# than it saves (tests/conftest.py, CHEAP_COMPILE; measured in docs/test_time.md)
pytestmark = pytest.mark.optimized_compile
DATA = pathlib.Path(__file__).parents[1] / "data" / "pretrained"
REAL_DIR = pathlib.Path(os.environ.get("POSENC_PRETRAINED_DIR",
                                       pathlib.Path(__file__).parents[2] / ".pretrained"))
META = json.loads((DATA / "smollm2_yarn.json").read_text())
ORIGINAL, LENGTH = 8192, 8704  # the original context C; the tokens run (past C)


@nnx.jit
def argmax_and_rows(model, tokens, rows):
    """The argmax at every position and the full logits at `rows` (not [T, V] to the host)."""
    logits = model(tokens)[0]
    return logits.argmax(-1), logits[rows]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["yarn2"])
def test_smollm2_at_10k_tokens_equals_transformers(case):
    path = REAL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        pytest.skip(f"{path} is absent: run `bash scripts/fetch_pretrained.sh {REAL_DIR}`")
    gold = np.load(DATA / "smollm2_yarn.npz")
    lm = pretrained.load(path, rope_scaling=META["cases"][case], attention="blockwise")
    n = META["num_hidden_layers"]
    lm.model.layers = nnx.List(list(lm.model.layers)[:n])    # the golden's truncated model
    ids = jnp.asarray(gold["ids"][:LENGTH])[None]               # [1, 8704] of [1, 10240]
    rows = [i for i, p in enumerate(META["full_positions"]) if ORIGINAL < p < LENGTH]
    assert rows, META["full_positions"]                          # 8500: past C
    positions = jnp.asarray(META["full_positions"])[jnp.asarray(rows)]
    argmax, full = map(np.asarray, argmax_and_rows(lm.model, ids, positions))
    err = np.abs(full - gold[f"{case}__full_logits"][rows]).max()
    assert err <= 1e-3, f"{case}: max |logit - transformers'| = {err:.2e} past 8192"
    agree = (argmax == gold[f"{case}__argmax"][:LENGTH]).mean()
    assert agree == 1.0, f"{case}: argmax agrees at {agree:.4%} of {LENGTH:,} positions"
