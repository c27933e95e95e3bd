"""Attention: a float64 NumPy reference, NoPE permutation equivariance, dense == blockwise
(values and gradients) for every encoding and mask, fully-masked rows, and the errors."""

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import posenc_jax
from posenc_jax.encodings.capabilities import QueryBias
from posenc_jax.model.attention import attend

OPTIMISED = {"xla_backend_optimization_level": 3}  # XLA's default, for _pair_fn (conftest)

H, K, D = 4, 2, 8
ENCODINGS = {
    "nope": {},
    "rope": {"head_dim": D},
    "alibi": {"num_heads": H},
    "t5": {"num_heads": H, "num_buckets": 8, "max_distance": 16},
    "shaw": {"head_dim": D, "max_relative_position": 3},
    "shaw_value": {"scheme": "shaw", "head_dim": D, "max_relative_position": 3, "value": True},
    "kerple": {"num_heads": H},
    "kerple_power": {"scheme": "kerple", "num_heads": H, "variant": "power"},
    "sandwich": {"num_heads": H, "embed_dim": 16},
    "fire": {"num_heads": H, "init_length": 16.0},
    "xpos": {"head_dim": D, "scale_base": 8.0},
}


def _encoding(name):
    kw = dict(ENCODINGS[name])
    enc = posenc_jax.get(kw.pop("scheme", name), **kw)
    params = enc.init(jax.random.key(7))
    params = jax.tree.map(lambda t: t * 20.0, params)  # large enough to matter in the tests
    return enc, params


def _qkv(key, b, lq, lk, h=H, kh=K, d=D):
    kq, kk, kv = jax.random.split(key, 3)
    return (jax.random.normal(kq, (b, lq, h, d)), jax.random.normal(kk, (b, lk, kh, d)),
            jax.random.normal(kv, (b, lk, kh, d)))


def reference(q, k, v, bias, mask):
    """float64 NumPy attention: bias [B|1, H, Lq, Lk] or None, mask bool same or None."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)           # head h -> kv h // G
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    z = p.sum(-1, keepdims=True)
    p = np.where(z > 0, p / np.where(z > 0, z, 1.0), 0.0)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.mark.parametrize("name", ["nope", "alibi", "t5", "shaw", "kerple", "kerple_power",
                                  "sandwich", "fire"])
def test_dense_matches_float64_reference(name):
    enc, params = _encoding(name)
    b, lq, lk = 2, 5, 9
    q, k, v = _qkv(jax.random.key(0), b, lq, lk)
    qp = jnp.array([[4, 5, 6, 7, 8], [2, 3, 4, 5, 6]])
    kp = jnp.broadcast_to(jnp.arange(lk), (b, lk))
    kmask = jnp.array([[1] * 9, [1] * 7 + [0] * 2], bool)
    out = jax.jit(lambda q, k, v, p: attend(q, k, v, encoding=enc, params=p, q_positions=qp,
                                            k_positions=kp, causal=True, k_mask=kmask))(
        q, k, v, params)
    scale = 1.0 / np.sqrt(D)
    bias = None
    if "bias" in enc.hooks:
        bias = enc.bias(params, qp, kp, q=q * scale) if isinstance(enc, QueryBias) else \
            enc.bias(params, qp, kp)
    mask = (np.asarray(kp)[:, None, None, :] <= np.asarray(qp)[:, None, :, None]) \
        & np.asarray(kmask)[:, None, None, :]
    np.testing.assert_allclose(out, reference(q, k, v, bias, mask), atol=2e-5, rtol=1e-5)


@jax.jit
def _nope_self_attention(x, wq, wk, wv):
    q, k, v = (jnp.einsum("ble,ehd->blhd", x, w) for w in (wq, wk, wv))
    pos = jnp.arange(x.shape[1])
    enc = posenc_jax.get("nope")
    kw = {"encoding": enc, "q_positions": pos, "k_positions": pos, "causal": False}
    return (attend(q, k, v, implementation="dense", **kw),
            attend(q, k, v, implementation="blockwise", block_q=4, block_k=4, **kw))


@given(length=st.sampled_from([3, 6]), heads=st.sampled_from([(2, 1), (4, 2)]),
       seed=st.integers(0, 2**16))
def test_nope_self_attention_is_permutation_equivariant(length, heads, seed):
    """attn(P x) = P attn(x) without positions (non-causal), projections included; both
    implementations (blockwise with 4-blocks, so L=6 spans two blocks)."""
    h, kh = heads
    b, e = 2, 12
    keys = jax.random.split(jax.random.key(seed), 5)
    x = jax.random.normal(keys[0], (b, length, e))
    ws = [jax.random.normal(kk, (e, n, D)) for kk, n in zip(keys[1:4], (h, kh, kh))]
    perm = jax.random.permutation(keys[4], length)
    for permuted, plain in zip(_nope_self_attention(x[:, perm], *ws),
                               _nope_self_attention(x, *ws)):
        chex.assert_trees_all_close(permuted, plain[:, perm], atol=1e-5, rtol=1e-5)


def _pair_fn(enc, impl, **kw):
    """(out, grads wrt q, k, v, params) of a scalar loss, jitted."""

    def loss(q, k, v, params):
        if "rotate" in enc.hooks:
            q, k = enc.rotate(params, q, k, kw["q_positions"], kw["k_positions"])
        out = attend(q, k, v, encoding=enc, params=params, implementation=impl, block_q=8,
                     block_k=16, **kw)
        return jnp.sum(jnp.sin(out) * jnp.cos(jnp.arange(out.shape[1]))[None, :, None, None]), out

    # XLA's default level: at O0 the blockwise gradients of masked rows are NaN (conftest)
    return jax.jit(lambda *a: jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(*a),
                   compiler_options=OPTIMISED)


# One mask case per encoding (compiling blockwise gradients is the slow part of this file);
# together they cover causal / bidirectional, segments, a k_mask and GQA (H=4, K=2).
MASK_CASES = {
    "nope": {"causal": False, "segments": True},
    "rope": {"causal": True, "segments": True, "kmask": True},
    "alibi": {"causal": True, "segments": True, "kmask": True},
    "t5": {"causal": False},
    "shaw": {"causal": True},
    "shaw_value": {"causal": False, "kmask": True},
    "kerple": {"causal": True, "segments": True},
    "xpos": {"causal": True, "segments": True, "kmask": True},
}


@pytest.mark.parametrize("name", list(MASK_CASES))
def test_blockwise_matches_dense_values_and_gradients(name):
    """Length 37 with blocks 8 x 16 (not multiples); positions offset per batch row."""
    cfg = MASK_CASES[name]
    enc, params = _encoding(name)
    b, length = 2, 37
    q, k, v = _qkv(jax.random.key(1), b, length, length)
    pos = jnp.stack([jnp.arange(length), jnp.arange(length) + 100])   # offsets per row
    kw = {"q_positions": pos, "k_positions": pos, "causal": cfg["causal"]}
    if cfg.get("segments"):
        seg = jnp.stack([jnp.repeat(jnp.arange(3), jnp.array([10, 20, 7]), total_repeat_length=37),
                         jnp.zeros(length, jnp.int32)])
        kw.update(q_segment_ids=seg, k_segment_ids=seg)
    if cfg.get("kmask"):
        kw.update(k_mask=jnp.arange(length)[None, :] % 5 != 3)
    (_, dense), g_dense = _pair_fn(enc, "dense", **kw)(q, k, v, params)
    (_, block), g_block = _pair_fn(enc, "blockwise", **kw)(q, k, v, params)
    assert np.all(np.isfinite(np.asarray(block)))
    chex.assert_trees_all_close(block, dense, atol=2e-5, rtol=2e-5)
    chex.assert_trees_all_close(g_block, g_dense, atol=5e-5, rtol=5e-5)


def test_blockwise_matches_dense_for_a_cache_shaped_query():
    """Lq=3 new queries against Lk=21 slots of which 13 are filled (decode/prefill shape)."""
    enc, params = _encoding("shaw")
    q, k, v = _qkv(jax.random.key(2), 2, 3, 21)
    kp = jnp.broadcast_to(jnp.arange(21), (2, 21))
    kw = {"q_positions": jnp.array([[10, 11, 12]]), "k_positions": kp, "causal": True,
              "k_mask": jnp.arange(21)[None, :] < 13}
    (_, dense), g_dense = _pair_fn(enc, "dense", **kw)(q, k, v, params)
    (_, block), g_block = _pair_fn(enc, "blockwise", **kw)(q, k, v, params)
    chex.assert_trees_all_close(block, dense, atol=2e-5, rtol=2e-5)
    chex.assert_trees_all_close(g_block, g_dense, atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("impl", ["dense", "blockwise"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(impl):
    enc, params = _encoding("alibi")
    q, k, v = _qkv(jax.random.key(3), 1, 6, 6)
    pos = jnp.arange(6)
    kmask = jnp.array([False, False, True, True, True, True])    # rows 0, 1 see nothing
    (_, out), grads = _pair_fn(enc, impl, q_positions=pos, k_positions=pos, causal=True,
                               k_mask=kmask)(q, k, v, params)
    np.testing.assert_array_equal(np.asarray(out[:, :2]), 0.0)
    assert np.all(np.isfinite(np.asarray(out)))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))


def test_causal_mask_follows_positions_not_the_index():
    """Keys stored in reverse order: the mask reads positions, so the result is unchanged."""
    enc, params = _encoding("alibi")
    q, k, v = _qkv(jax.random.key(4), 1, 6, 6)
    pos = jnp.arange(6)

    @jax.jit
    def f(k, v, kp):
        kw = {"encoding": enc, "params": params, "q_positions": pos, "k_positions": kp}
        return (attend(q, k, v, **kw),
                attend(q, k, v, implementation="blockwise", block_q=4, block_k=4, **kw))

    chex.assert_trees_all_close(f(k[:, ::-1], v[:, ::-1], pos[::-1]), f(k, v, pos),
                                atol=1e-5, rtol=1e-5)


def test_errors_name_the_bad_values():
    enc = posenc_jax.get("nope")
    q, k, v = _qkv(jax.random.key(5), 1, 4, 4)
    pos = jnp.arange(4)
    kw = {"encoding": enc, "q_positions": pos, "k_positions": pos}
    with pytest.raises(ValueError, match="unknown attention implementation 'flash'.*'dense', "
                                         "'blockwise'"):
        attend(q, k, v, implementation="flash", **kw)
    q3 = jnp.zeros((1, 4, 3, D))
    with pytest.raises(ValueError, match="num_heads H=3 must be divisible by num_kv_heads K=2"):
        attend(q3, k, v, **kw)
    alibi3 = posenc_jax.get("alibi", num_heads=3)
    for impl in ("dense", "blockwise"):
        with pytest.raises(ValueError, match="bias with 3 heads but the attention scores have "
                                             "num_heads=4"):
            attend(q, k, v, encoding=alibi3, q_positions=pos, k_positions=pos,
                   implementation=impl)
    with pytest.raises(ValueError, match="block_q must be >= 1, got block_q=0"):
        attend(q, k, v, implementation="blockwise", block_q=0, **kw)
    with pytest.raises(ValueError, match="give both q_segment_ids and k_segment_ids"):
        attend(q, k, v, q_segment_ids=pos, **kw)
    with pytest.raises(ValueError, match=r"q_positions must have shape \[4\] or \[B=1, 4\]"):
        attend(q, k, v, encoding=enc, q_positions=jnp.arange(5), k_positions=pos)


def test_capabilities_are_checked_by_attention_not_by_name():
    """A bias that needs whole rows of logits (CoPE) is dense only; a causal-only scheme
    (xPos) refuses bidirectional attention; both errors name the alternative."""
    q, k, v = _qkv(jax.random.key(6), 1, 4, 4)
    pos = jnp.arange(4)
    cope = posenc_jax.get("cope", head_dim=D)
    with pytest.raises(ValueError, match=r"encoding 'cope' reads whole rows.*use "
                                         r"attention='dense'"):
        attend(q, k, v, encoding=cope, params=cope.init(jax.random.key(0)), q_positions=pos,
               k_positions=pos, implementation="blockwise")
    xpos = posenc_jax.get("xpos", head_dim=D)
    for impl in ("dense", "blockwise"):
        with pytest.raises(ValueError, match=r"encoding 'xpos' is defined for causal attention "
                                             r"only; got causal=False"):
            attend(q, k, v, encoding=xpos, q_positions=pos, k_positions=pos, causal=False,
                   implementation=impl)
