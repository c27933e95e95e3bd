"""The model's parts for a loss without [B, L, V] logits (`Transformer.hidden_states`,
`Transformer.head`, `posenc_jax.model.loss`): the chunked loss equals the full logits' loss,
values and gradients, for tied and untied heads, a soft-cap, weights, a chunk that does not
divide L; its compiled program never holds a [B, L, V] array; bad input is refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax import Transformer, TransformerConfig
from posenc_jax.model import loss

B, L, V = 2, 37, 50


def _model(**kw):
    cfg = TransformerConfig(vocab_size=V, num_layers=2, embed_dim=32, num_heads=4, mlp_dim=48,
                            encoding="rope", **kw)
    return Transformer(cfg, rngs=nnx.Rngs(0))


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, V, (B, L + 1)), jnp.int32)
    weights = jnp.asarray(rng.random((B, L)) < 0.8, jnp.float32)
    return tokens[:, :-1], tokens[:, 1:], weights


def _reference(logits, targets, weights):
    """float64 NumPy: sum w * (logsumexp - picked), sum w."""
    z = np.asarray(logits, np.float64)
    m = z.max(-1, keepdims=True)
    lse = np.log(np.exp(z - m).sum(-1)) + m[..., 0]
    picked = np.take_along_axis(z, np.asarray(targets)[..., None], -1)[..., 0]
    w = np.asarray(weights, np.float64)
    return float(((lse - picked) * w).sum()), float(w.sum())


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": False}, {"final_logit_softcap": 3.0}],
                         ids=["tied", "untied", "softcap"])
def test_hidden_then_head_is_the_forward(kw):
    model = _model(**kw)
    inputs, _, _ = _batch()

    @nnx.jit  # one program: the two paths must be the same ops, bit for bit
    def both(m, x):
        hidden = m.hidden_states(x)
        return hidden, m.head(hidden), m(x)

    hidden, logits, forward = both(model, inputs)
    assert hidden.shape == (B, L, 32)
    assert logits.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(forward))


@pytest.mark.parametrize("chunk", [1, 8, 37, 64])
@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": False, "final_logit_softcap": 3.0}],
                         ids=["tied", "untied-softcap"])
def test_chunked_equals_full_values_and_gradients(chunk, kw):
    model = _model(**kw)
    inputs, targets, weights = _batch(1)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def chunked(p):
        m = nnx.merge(graphdef, p, rest)
        return loss.chunked_cross_entropy(m.head, m.hidden_states(inputs), targets, weights,
                                          chunk=chunk)

    def full(p):
        m = nnx.merge(graphdef, p, rest)
        return loss.cross_entropy_sums(m(inputs), targets, weights)

    (c_sum, c_w), c_grad = jax.jit(jax.value_and_grad(chunked, has_aux=True))(params)
    (f_sum, f_w), f_grad = jax.jit(jax.value_and_grad(full, has_aux=True))(params)
    want, want_w = _reference(model(inputs), targets, weights)
    np.testing.assert_allclose(float(c_sum), want, rtol=1e-5)
    assert float(c_w) == float(f_w) == want_w
    np.testing.assert_allclose(float(c_sum), float(f_sum), rtol=1e-6)
    for g1, g2 in zip(jax.tree.leaves(c_grad), jax.tree.leaves(f_grad), strict=True):
        np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-5, atol=1e-6)


def test_token_nll_rows_and_no_weights():
    model = _model()
    inputs, targets, _ = _batch(2)
    nll = loss.token_nll(model.head, model.hidden_states(inputs), targets, chunk=5)
    assert nll.shape == (B, L)
    total, count = loss.chunked_cross_entropy(model.head, model.hidden_states(inputs), targets,
                                              chunk=5)
    assert float(count) == B * L
    np.testing.assert_allclose(float(total), float(nll.sum()), rtol=1e-6)
    want, _ = _reference(model(inputs), targets, np.ones((B, L)))
    np.testing.assert_allclose(float(nll.sum()), want, rtol=1e-5)


def test_compiled_gradient_never_holds_the_logits():
    """With V large and L long, the chunked loss's backward keeps no [B, L, V] buffer."""
    v, length, e = 4096, 512, 16
    head_w = jax.ShapeDtypeStruct((e, v), jnp.float32)
    hidden = jax.ShapeDtypeStruct((1, length, e), jnp.float32)
    targets = jax.ShapeDtypeStruct((1, length), jnp.int32)

    def f(w, h, t):
        return loss.chunked_cross_entropy(lambda x: x @ w, h, t, chunk=64)[0]

    def g(w, h, t):
        return loss.cross_entropy_sums((h @ w), t)[0]

    chunked = jax.jit(jax.grad(f, argnums=(0, 1))).lower(head_w, hidden, targets).as_text()
    full = jax.jit(jax.grad(g, argnums=(0, 1))).lower(head_w, hidden, targets).as_text()
    big = f"{length}x{v}xf32"
    assert big in full and big not in chunked


def test_bad_input_is_refused_by_name():
    model = _model()
    inputs, targets, weights = _batch()
    hidden = model.hidden_states(inputs)
    with pytest.raises(ValueError, match="chunk must be >= 1, got chunk=0"):
        loss.chunked_cross_entropy(model.head, hidden, targets, chunk=0)
    with pytest.raises(TypeError, match="chunk must be an int"):
        loss.token_nll(model.head, hidden, targets, chunk=2.5)
    with pytest.raises(ValueError, match=r"hidden must be \[B, L, E\] and targets \[B, L\]"):
        loss.token_nll(model.head, hidden, targets[:, :-1])
    with pytest.raises(TypeError, match="targets must be integer token ids"):
        loss.token_nll(model.head, hidden, targets.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"weights must be \[B, L\]"):
        loss.chunked_cross_entropy(model.head, hidden, targets, weights[:, :-1])
    with pytest.raises(ValueError, match="tokens must be an int array"):
        model.hidden_states(jnp.zeros((B, L), jnp.float32))
