"""posenc_jax.checks: the message of each helper names the key and the value, and says only
what is true wherever the helper is called."""

import jax.numpy as jnp
import pytest
from flax import nnx

from posenc_jax import Transformer, TransformerConfig, checks


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
