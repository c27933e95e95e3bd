"""The Linen wrappers call the same pure functions and keep their tables in "params"."""

import chex
import jax
import jax.numpy as jnp
import pytest

from posenc_jax.encodings import alibi, rope, sinusoidal
from posenc_jax.model.linen import PositionEmbedding, Rotary, ScoreBias

B, L, H, D, E = 2, 6, 4, 8, 16
POS = jnp.broadcast_to(jnp.arange(L) + 3, (B, L))


def test_sinusoidal_embedding_is_stateless_and_adds_the_table():
    x = jax.random.normal(jax.random.key(0), (B, L, E))
    layer = PositionEmbedding("sinusoidal", {"embed_dim": E})
    variables = layer.init(jax.random.key(1), x, POS)
    assert not jax.tree.leaves(variables)
    out = jax.jit(layer.apply)(variables, x, POS)
    chex.assert_trees_all_close(out, x + sinusoidal.encode(POS, E), atol=1e-6)


def test_learned_embedding_keeps_its_table_in_params():
    x = jnp.zeros((B, L, E))
    layer = PositionEmbedding("learned", {"embed_dim": E, "max_len": 16})
    variables = layer.init(jax.random.key(1), x, POS)
    table = variables["params"]["pe"]["table"]
    assert table.shape == (16, E)
    chex.assert_trees_all_close(jax.jit(layer.apply)(variables, x, POS), table[POS])


def test_rotary_matches_rope_apply():
    q = jax.random.normal(jax.random.key(2), (B, L, H, D))
    k = jax.random.normal(jax.random.key(3), (B, L, 2, D))
    layer = Rotary({"head_dim": D, "base": 500.0})
    rq, rk = jax.jit(layer.apply)(layer.init(jax.random.key(0), q, k, POS), q, k, POS)
    freqs = rope.inv_freq(D, base=500.0)
    chex.assert_trees_all_close(rq, rope.apply(q, POS, freqs), atol=1e-6)
    chex.assert_trees_all_close(rk, rope.apply(k, POS, freqs), atol=1e-6)


def test_score_biases():
    layer = ScoreBias("alibi", {"num_heads": H})
    variables = layer.init(jax.random.key(0), POS, POS)
    chex.assert_trees_all_close(jax.jit(layer.apply)(variables, POS, POS),
                                alibi.bias(alibi.slopes(H), POS, POS))
    t5 = ScoreBias("t5", {"num_heads": H, "num_buckets": 8})
    variables = t5.init(jax.random.key(0), POS, POS)
    assert variables["params"]["pe"]["table"].shape == (8, H)
    chex.assert_shape(jax.jit(t5.apply)(variables, POS, POS), (B, H, L, L))
    q = jax.random.normal(jax.random.key(4), (B, L, H, D))
    shaw = ScoreBias("shaw", {"head_dim": D, "max_relative_position": 2})
    variables = shaw.init(jax.random.key(0), POS, POS, q)
    table = variables["params"]["pe"]["table"]                        # [2K + 1, D]
    out = jax.jit(shaw.apply)(variables, POS, POS, q)
    rel = jnp.clip(POS[:, None, :] - POS[:, :, None], -2, 2) + 2     # [B, Lq, Lk]
    expected = jnp.einsum("bqhd,bqkd->bhqk", q, table[rel])
    chex.assert_trees_all_close(out, expected, atol=1e-5)
    with pytest.raises(ValueError, match="encoding 'rope' has no bias hook"):
        ScoreBias("rope", {"head_dim": D}).init(jax.random.key(0), POS, POS)
