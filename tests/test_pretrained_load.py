"""`pretrained.load` against transformers 5.24's own logits (goldens made by
scripts/make_pretrained_golden.py in a throwaway venv; no torch here).

Tiny random-weight checkpoints of every family (safetensors; llama sharded with an index), with
and without a rope_scaling: within 1e-4. The two real models (GGUF, fetched by
scripts/fetch_pretrained.sh into $POSENC_PRETRAINED_DIR): full-vocabulary logits at the recorded
positions within 1e-3, the same argmax at every position of a 1,500-token text (past Gemma 3's
512 window), the 32-token greedy continuation with the KV cache. Errors name the file and tensor.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax import pretrained
from posenc_jax.model.generate import generate

DATA = pathlib.Path(__file__).parent / "data" / "pretrained"
UNSUPPORTED = {"phi3"}  # a fixture of the golden script; the loader has no Phi-3 record yet
TINY = sorted(p.name for p in (DATA / "tiny").iterdir()
              if (p / "config.json").exists() and p.name not in UNSUPPORTED)
REAL_DIR = pathlib.Path(os.environ.get("POSENC_PRETRAINED_DIR",
                                       pathlib.Path(__file__).parents[1] / ".pretrained"))


def _cases(family):
    return json.loads((DATA / "tiny" / family / "cases.json").read_text())


@pytest.mark.parametrize("family", TINY)
def test_tiny_family_logits_equal_transformers(family):
    gold = np.load(DATA / "tiny" / family / "logits.npz")
    ids = jnp.asarray(gold["token_ids"]).reshape(1, -1)
    for case, rope in _cases(family).items():
        lm = pretrained.load(DATA / "tiny" / family, rope_scaling=rope)
        ours = np.asarray(lm.model(ids))[0]
        want = gold[f"logits__{case}"].reshape(ours.shape)
        np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0, err_msg=f"{family}/{case}")


def _real(name):
    path = REAL_DIR / name
    if not path.exists():
        pytest.skip(f"{path} is absent: run `bash scripts/fetch_pretrained.sh {REAL_DIR}`")
    return path


@pytest.fixture(scope="module", params=[("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                                        ("gemma3", "gemma-3-270m-q4_k_m.gguf")])
def real(request):
    key, file = request.param
    lm = pretrained.load(_real(file))
    meta = json.loads((DATA / f"{key}.json").read_text())
    return key, lm, meta, np.load(DATA / f"{key}.npz")


def test_real_model_logits_equal_transformers(real):
    key, lm, meta, gold = real
    forward = nnx.jit(lambda m, t: m(t))
    for text, positions in meta["full_positions"].items():
        ids = gold[f"{text}__ids"]
        logits = np.asarray(forward(lm.model, jnp.asarray(ids)[None]))[0]
        np.testing.assert_array_equal(logits.argmax(-1), gold[f"{text}__argmax"],
                                      err_msg=f"{key}/{text}: argmax")
        full = logits[np.asarray(positions)]
        err = np.abs(full - gold[f"{text}__full_logits"]).max()
        assert err <= 1e-3, f"{key}/{text}: max |logit - transformers'| = {err:.2e}"
        top = np.take_along_axis(logits, gold[f"{text}__topk_indices"], axis=-1)
        np.testing.assert_allclose(top, gold[f"{text}__topk_values"], atol=1e-3, rtol=0)


def test_real_model_greedy_equals_transformers(real):
    key, lm, meta, _ = real
    for prompt, want in list(meta["greedy"].items())[:1]:  # the second prompt: same path
        assert lm.tokenizer.encode(prompt) == want["prompt_ids"], prompt
        out = generate(lm.model, jnp.asarray(want["prompt_ids"])[None],
                       max_new_tokens=len(want["new_ids"]), temperature=0.0)
        got = np.asarray(out)[0, len(want["prompt_ids"]):].tolist()
        assert got == want["new_ids"], (key, prompt, lm.tokenizer.decode(got))


def _copy_tiny(tmp_path, family="qwen3"):
    dst = tmp_path / family
    shutil.copytree(DATA / "tiny" / family, dst)
    return dst


def test_unknown_model_type_names_the_file(tmp_path):
    d = _copy_tiny(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "bloom"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="bloom") as info:
        pretrained.load(d)
    assert str(d) in str(info.value)


def test_missing_and_misshapen_tensors_name_the_file_and_tensor(tmp_path):
    from safetensors.numpy import load_file, save_file
    d = _copy_tiny(tmp_path)
    tensors = load_file(d / "model.safetensors")
    name = "model.layers.0.self_attn.k_proj.weight"
    save_file({k: v for k, v in tensors.items() if k != name}, d / "model.safetensors")
    with pytest.raises(ValueError, match=name.replace(".", r"\.")) as info:
        pretrained.load(d)
    assert str(d) in str(info.value)
    save_file({**tensors, name: tensors[name][:, :-1].copy()}, d / "model.safetensors")
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        pretrained.load(d)


def test_phi3_is_refused_naming_the_supported_families():
    with pytest.raises(ValueError, match="unsupported model_type='phi3'; supported: 'llama'"):
        pretrained.load(DATA / "tiny" / "phi3")


def test_a_path_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        pretrained.load(tmp_path / "nothing")
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="neither a directory nor a .gguf file"):
        pretrained.load(tmp_path / "x.bin")
    with pytest.raises(TypeError, match="path must be a str or PathLike"):
        pretrained.load(3)
