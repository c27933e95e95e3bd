"""Shaw et al.'s value-side term a^V (the `value=True` option of `shaw`): the term against
float64, attention output against a float64 model of eq. (3), blockwise == dense (values and
gradients), and no value table unless asked for."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc_jax
from posenc_jax.encodings import relative
from posenc_jax.encodings.capabilities import ValueTerm
from posenc_jax.encodings.shaw import Shaw, ShawValue
from posenc_jax.model.attention import attend

D, H, K = 8, 4, 2
ENC = posenc_jax.get("shaw", head_dim=D, max_relative_position=K, value=True)


def params_of(seed):
    return jax.tree.map(lambda t: t * 30.0, ENC.init(jax.random.key(seed)))


def test_value_term_matches_float64():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((2 * K + 1, D))
    w = rng.random((2, H, 5, 7))
    qp, kp = np.array([[3, 4, 5, 6, 7], [0, 1, 2, 3, 4]]), np.array([[0, 1, 2, 3, 4, 5, 9]])
    got = jax.jit(relative.shaw_value_term, static_argnames="max_relative_position")(
        jnp.asarray(table, jnp.float32), jnp.asarray(w, jnp.float32), qp, kp,
        max_relative_position=K)
    idx = np.clip(kp[:, None, :] - qp[:, :, None], -K, K) + K                  # [B, Lq, Lk]
    want = np.einsum("bhqk,bqkd->bhqd", w, table[idx])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_attention_output_is_eq3_of_the_paper():
    """z_i = sum_j alpha_ij (v_j + a^V_ij), alpha from e_ij = q_i . (k_j + a^K_ij) / sqrt(d)."""
    params = params_of(1)
    kq, kk, kv = jax.random.split(jax.random.key(2), 3)
    q, k, v = (jax.random.normal(x, (1, 6, H, D)) for x in (kq, kk, kv))
    pos = jnp.arange(6)
    got = jax.jit(lambda q, k, v, p: attend(q, k, v, encoding=ENC, params=p, q_positions=pos,
                                            k_positions=pos, causal=True))(q, k, v, params)
    q64, k64, v64 = (np.asarray(t, np.float64) for t in (q, k, v))
    ak, av = (np.asarray(params[n], np.float64) for n in ("table", "value_table"))
    idx = np.clip(np.arange(6)[None, :] - np.arange(6)[:, None], -K, K) + K     # [q, k]
    e = (np.einsum("qhd,khd->hqk", q64[0], k64[0])
         + np.einsum("qhd,qkd->hqk", q64[0], ak[idx])) / np.sqrt(D)
    e = np.where(np.tril(np.ones((6, 6), bool)), e, -np.inf)
    a = np.exp(e - e.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    want = np.einsum("hqk,khd->qhd", a, v64[0]) + np.einsum("hqk,qkd->qhd", a, av[idx])
    np.testing.assert_allclose(np.asarray(got)[0], want, rtol=2e-5, atol=2e-5)


@pytest.mark.optimized_compile  # the blockwise backward at O0: tests/model/conftest.py
def test_blockwise_equals_dense_values_and_gradients():
    params = params_of(3)
    kq, kk, kv = jax.random.split(jax.random.key(4), 3)
    q = jax.random.normal(kq, (2, 13, H, D))
    k, v = (jax.random.normal(x, (2, 13, 2, D)) for x in (kk, kv))
    pos = jnp.stack([jnp.arange(13), jnp.arange(13) + 50])

    def loss(impl):
        def f(q, k, v, p):
            out = attend(q, k, v, encoding=ENC, params=p, q_positions=pos, k_positions=pos,
                         causal=True, implementation=impl, block_q=4, block_k=8)
            return jnp.sum(jnp.sin(out)), out
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True))

    (_, dense), g_dense = loss("dense")(q, k, v, params)
    (_, block), g_block = loss("blockwise")(q, k, v, params)
    chex.assert_trees_all_close(block, dense, atol=2e-5, rtol=2e-5)
    chex.assert_trees_all_close(g_block, g_dense, atol=5e-5, rtol=5e-5)
    assert float(jnp.abs(g_dense[3]["value_table"]).sum()) > 0


def test_value_table_only_when_asked_and_errors():
    plain = posenc_jax.get("shaw", head_dim=D)
    assert set(plain.init(jax.random.key(0))) == {"table"} and not isinstance(plain, ValueTerm)
    assert set(ENC.init(jax.random.key(0))) == {"table", "value_table"}
    assert isinstance(ENC, ValueTerm) and type(ENC) is ShawValue and isinstance(ENC, Shaw)
    # the key table is the same draw with or without the value table
    np.testing.assert_array_equal(plain.init(jax.random.key(0))["table"],
                                  posenc_jax.get("shaw", head_dim=D, max_relative_position=16,
                                                 value=True).init(jax.random.key(0))["table"])
    with pytest.raises(TypeError, match="value must be a bool"):
        posenc_jax.get("shaw", head_dim=D, value=1)
