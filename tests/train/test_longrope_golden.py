"""transformers gives our logits for the tiny Llama exported with LongRoPE factors: the ones our
search found (scripts/longrope_export_case.py) and the search's NTK-rule seed (non-uniform).

The golden (tests/data/pretrained/longrope, made by scripts/make_longrope_golden.py in a
throwaway torch venv) holds transformers' logits and the sha256 of the files it read; here the
same export is written again without torch, its files must hash the same (so the comparison is
with what transformers loaded), and our logits must match transformers'.
"""

import hashlib
import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from posenc_jax import pretrained

HERE = pathlib.Path(__file__).resolve().parent
TINY = HERE.parent / "data" / "pretrained" / "tiny" / "llama"
GOLDEN = HERE.parent / "data" / "pretrained" / "longrope"
CASES = json.loads((GOLDEN / "golden.json").read_text())["cases"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_transformers_gives_our_logits_with_the_exported_factors(name, tmp_path):
    case = CASES[name]
    assert case["class"] == "LlamaForCausalLM" and case["rope"]["rope_type"] == "longrope"
    assert case["rope"]["long_factor"] == case["rope_scaling"]["long_factor"]
    lm = pretrained.load(TINY, rope_scaling=case["rope_scaling"])
    pretrained.save(lm, tmp_path)
    for file, digest in case["sha256"].items():
        assert hashlib.sha256((tmp_path / file).read_bytes()).hexdigest() == digest, file
    tokens = jnp.asarray([case["tokens"]])
    assert tokens.shape[1] > case["rope_scaling"]["original_max_position_embeddings"]
    want = np.load(GOLDEN / "golden.npz")[name]
    ours = np.asarray(pretrained.load(tmp_path).model(tokens))
    np.testing.assert_allclose(ours, want, atol=2e-4, rtol=2e-4)


def test_the_two_cases_differ_where_the_factors_do():
    a, b = (np.load(GOLDEN / "golden.npz")[n] for n in ("ntk_seed", "searched"))
    assert CASES["ntk_seed"]["rope_scaling"]["long_factor"] != CASES["searched"][
        "rope_scaling"]["long_factor"]
    assert np.abs(a - b).max() > 1e-3
