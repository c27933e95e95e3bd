"""posenc_jax.checks: the message of each helper names the key and the value, and says only
what is true wherever the helper is called."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc_jax
from posenc_jax import Transformer, TransformerConfig, checks, hf_config
from posenc_jax.encodings import rope_scaling


def test_integer_array_message_does_not_claim_a_table():
    """RoPE positions index no table; the message used to say "(they index a table)"."""
    with pytest.raises(TypeError) as err:
        checks.integer_array("positions", jnp.arange(4.0))
    assert "table" not in str(err.value)
    assert "positions must have an integer dtype" in str(err.value)
    assert "dtype=float32" in str(err.value)
    model = Transformer(TransformerConfig(vocab_size=8, num_layers=1, embed_dim=8, num_heads=2,
                                          mlp_dim=8, encoding="rope"), rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"must have an integer dtype") as err:
        model(jnp.zeros((1, 4), jnp.int32), jnp.arange(4.0))
    assert "table" not in str(err.value)


@pytest.mark.parametrize("value, want", [(4096, 4096), (4096.0, 4096)])
def test_json_count_takes_integral_floats(value, want):
    got = checks.json_count("max_position_embeddings", value)
    assert got == want and type(got) is int


@pytest.mark.parametrize("value, error, match", [
    (4096.5, TypeError, r"must be an int, got max_position_embeddings=4096.5 \(float\)"),
    ("4096", TypeError, r"must be an int, got max_position_embeddings='4096' \(str\)"),
    (True, TypeError, r"must be an int, got max_position_embeddings=True \(bool\)"),
    (float("nan"), ValueError, r"max_position_embeddings must be finite"),
    (0, ValueError, r"max_position_embeddings must be >= 1, got max_position_embeddings=0"),
])
def test_json_count_refuses_naming_the_value(value, error, match):
    with pytest.raises(error, match=match):
        checks.json_count("max_position_embeddings", value)


def test_integer_array_refuses_host_integers_that_jax_would_wrap():
    """jnp.asarray(np.int64(3_000_000_000)) is -1_294_967_296 under the default int32: a
    position past 2**31 - 1 silently became a negative one."""
    big = np.array([0, 3_000_000_000], np.int64)
    with pytest.raises(ValueError, match=r"positions must fit in int32 \(JAX would wrap them "
                                         r"silently\), got values in \[0, 3000000000\]"):
        checks.integer_array("positions", big)
    with pytest.raises(ValueError, match=r"must fit in int32"):
        checks.integer_array("positions", [2**31])
    ok = checks.integer_array("positions", np.array([0, 2**31 - 1], np.int64))
    assert ok.dtype == jnp.int32 and int(ok[1]) == 2**31 - 1
    q = np.zeros((1, 2, 2, 128), np.float32)
    llama = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 2}
    with pytest.raises(ValueError, match=r"position_ids must fit in int32"):
        hf_config.rotate_like_hf(llama, q, q[:, :, :1], big[None])


def test_library_warnings_point_at_the_callers_line():
    """Each warning names the user's file, whichever public entry point led to it (a fixed
    stacklevel pointed at posenc_jax/encodings/hf_config.py or deeper)."""
    llama = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 2,
             "rope_scaling": {"rope_type": "linear", "factor": 2.0, "fctor": 3.0}}
    q = np.zeros((1, 2, 2, 128), np.float32)
    calls = [lambda: rope_scaling.validate(llama["rope_scaling"], rotary_dim=64),
             lambda: hf_config.rope_kwargs_from_hf_config(llama),
             lambda: hf_config.rotate_like_hf(llama, q, q[:, :, :1], np.arange(2)[None]),
             lambda: posenc_jax.get("rope", head_dim=64, scaling=llama["rope_scaling"])]
    for call in calls:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        assert [w.filename for w in caught] == [__file__], [(w.filename, w.lineno) for w in caught]
