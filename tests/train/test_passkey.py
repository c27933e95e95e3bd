"""Passkey retrieval: the documents (train.datasets.passkey) and the accuracy (train.passkey_eval).

Documents: exact length, the key only in the needle and the question, the needle at a
sentence boundary, deterministic eval sets per (length, seed). Accuracy: parity with a direct
argmax over the model's logits, on the 8-device mesh, with a trial count that does not divide
the batch.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.transformer import Transformer, complete_rules
from train import passkey_eval, sharding
from train.datasets import passkey


@settings(max_examples=40, deadline=None)
@given(length=st.integers(passkey.min_length(), 600), seed=st.integers(0, 2**31),
       digits=st.integers(1, 8))
def test_document_hides_one_key_at_a_sentence_boundary(length, seed, digits):
    if length < passkey.min_length(digits):
        return
    doc = passkey.document(np.random.default_rng(seed), length, digits=digits)
    key = doc[-digits:]
    needle = passkey.NEEDLE_PREFIX + key + b". "
    assert len(doc) == length and key.isdigit() and len(key) == digits
    assert doc.endswith(passkey.NEEDLE_PREFIX + key)
    assert doc.count(needle) == 1 and doc.count(b"=") == 2
    assert sum(c in b"0123456789" for c in doc) == 2 * digits  # no digit outside the key
    before = doc[:doc.index(needle)]
    assert before == b"" or before.endswith(b". ")              # a sentence boundary


def test_depths_cover_the_document():
    ev = passkey.eval_set(512, trials=200, seed=0)
    depths = ev.depths / 512
    assert depths.min() < 0.1 and depths.max() > 0.8         # near the start and near the end
    assert 0.35 < np.median(depths) < 0.6


def test_eval_sets_are_deterministic_per_length_and_seed():
    a = passkey.eval_set(128, trials=16, seed=3)
    np.testing.assert_array_equal(a.tokens, passkey.eval_set(128, trials=16, seed=3).tokens)
    assert not np.array_equal(a.tokens, passkey.eval_set(128, trials=16, seed=4).tokens)
    assert a.tokens.shape == (16, 128) and a.tokens.dtype == np.uint8
    np.testing.assert_array_equal(a.tokens[:4], passkey.eval_set(128, trials=4, seed=3).tokens)
    assert bytes(a.keys[0]) == bytes(a.tokens[0, -5:])


def test_errors_name_the_value():
    with pytest.raises(ValueError, match=r"digits=5 needs length >= 20 bytes, got length=19"):
        passkey.document(np.random.default_rng(0), 19)
    with pytest.raises(ValueError, match=r"trials must be >= 1, got trials=0"):
        passkey.eval_set(64, trials=0)
    with pytest.raises(ValueError, match=r"digits must be >= 1, got digits=0"):
        passkey.eval_set(64, trials=1, digits=0)
    with pytest.raises(TypeError, match=r"length must be an int, got length=64.0"):
        passkey.eval_set(64.0, trials=1)


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_accuracy_matches_a_direct_argmax(encoding):
    config = TransformerConfig(vocab_size=256, num_layers=1, embed_dim=16, num_heads=2,
                               mlp_dim=32, encoding=encoding)
    model = Transformer(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(params)
    ev = passkey.eval_set(48, trials=11, seed=1, digits=1)
    # plant the argmax as the key in every other document so both outcomes occur (a 1-digit
    # key: the logits that predict it do not read it)
    logits = np.asarray(model(jnp.asarray(ev.tokens, jnp.int32), jnp.arange(48)))
    predicted = logits[:, -2].argmax(-1)
    tokens = ev.tokens.copy()
    tokens[::2, -1] = predicted[::2]
    ev = passkey.EvalSet(tokens=tokens, depths=ev.depths, digits=1, seed=1)
    expected = predicted == tokens[:, -1]
    mesh = sharding.make_mesh({"data": -1})
    rules = complete_rules((("batch", sharding.BATCH_AXES),))
    out = passkey_eval.passkey_accuracy(graphdef, params, ev, mesh=mesh, rules=rules,
                                        batch_size=4)
    assert jax.device_count() == 8 and out["trials"] == 11
    assert out["correct"] == int(expected.sum()) >= 6
    assert out["accuracy"] == pytest.approx(expected.mean())
