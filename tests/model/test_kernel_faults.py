"""The kernel's correctness holes (issue 26), each a test that failed before its fix:

* bidirectional attention without segment ids: `visibility` gave [B, 1, nk] and the kernels
  read `vis[b, i, j]` for every query block -- under the bounds checker
  (`InterpretParams(out_of_bounds_reads="raise")`) both kernel structures now read in bounds
  and equal dense;
* a query at the first position of every key block keeps that block (block skipping's
  `k_min <= q_max`), and decoding with the kernel across a block boundary equals the forward;
* the head-count check dense makes; L = 0 and B = 0 give zeros like dense;
* int64 positions near 2^31 under `jax_enable_x64` do not wrap;
* FIRE and KERPLE cross-lower for TPU (rank-0 / rank-1 parameters); FIRE's MLP cannot lower
  for Triton (`slice`), which `unsupported_reason` says, so "auto" can avoid it.

Tolerances as tests/model/test_pallas.py (float32: 2e-5 on values, 1e-4 relative on gradients).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas import tpu as pltpu
from kernel_helpers import jit, normal, numpy_model

import posenc_jax
from posenc_jax.encodings import base
from posenc_jax.model.attention import attend
from posenc_jax.model.kernels import flash_attention, unsupported_reason
from posenc_jax.model.transformer import TransformerConfig, init_cache

H, K, D = 4, 2, 16
CHECKED = pltpu.InterpretParams(out_of_bounds_reads="raise")


def _qkv(b, lq, lk, seed=0):
    return normal(seed, (b, lq, H, D), (b, lk, K, D), (b, lk, K, D))


def _dense(enc, params, q, k, v, qp, kp, causal, **kw):
    return attend(q, k, v, encoding=enc, params=params, q_positions=qp, k_positions=kp,
                  causal=causal, implementation="dense", **kw)


@pytest.mark.parametrize("cpu_kernel", ["gpu", "tpu"])
def test_bidirectional_without_segments_reads_in_bounds_and_equals_dense(cpu_kernel):
    """L=40 in 16-blocks (3 query blocks, 3 key blocks), values and gradients."""
    enc = posenc_jax.get("alibi", num_heads=H)
    q, k, v = _qkv(1, 40, 40)
    pos = jnp.arange(40, dtype=jnp.int32)[None]

    def kernel(q, k, v):
        return flash_attention(q, k, v, encoding=enc, params={}, q_positions=pos,
                               k_positions=pos, causal=False, block_q=16, block_k=16,
                               cpu_kernel=cpu_kernel, interpret=CHECKED)

    def dense(q, k, v):
        return _dense(enc, {}, q, k, v, pos, pos, False)

    def out_and_grads(f):  # one compiled program: the output and its gradients
        def loss(*a):
            out = f(*a)
            return jnp.sum(jnp.sin(out)), out
        return jit(lambda *a: jax.grad(loss, (0, 1, 2), has_aux=True)(*a)[::-1])

    (out, grads), (want, wants) = out_and_grads(kernel)(q, k, v), out_and_grads(dense)(q, k, v)
    np.testing.assert_allclose(out, want, atol=2e-5)
    for g, r in zip(grads, wants):
        np.testing.assert_allclose(g, r, atol=1e-4 * max(1.0, float(jnp.abs(r).max())))


def test_a_query_at_every_key_block_start_sees_that_block():
    """One query per batch row, at positions 0, 16, 32, 48 (each the first key of a 16-key
    block), causal: the block that starts at the query holds its only newest key."""
    enc = posenc_jax.get("alibi", num_heads=H)
    starts = jnp.array([[0], [16], [32], [48]], jnp.int32)
    q, k, v = _qkv(4, 1, 64)
    kp = jnp.arange(64, dtype=jnp.int32)[None]
    want = jit(lambda q, k, v: _dense(enc, {}, q, k, v, starts, kp, True))(q, k, v)
    for cpu_kernel in ("gpu", "tpu"):  # one compiled program each
        out = jit(lambda q, k, v, c=cpu_kernel: flash_attention(
            q, k, v, encoding=enc, params={}, q_positions=starts, k_positions=kp, causal=True,
            block_q=16, block_k=16, cpu_kernel=c, interpret=CHECKED))(q, k, v)
        np.testing.assert_allclose(out, want, atol=2e-5)


def test_decoding_across_a_block_boundary_with_the_kernel_equals_the_forward():
    """Kernel blocks of 16: prefill 14 tokens, then one token at a time to 19 (the cache's
    second key block starts at 16)."""
    cfg = TransformerConfig(vocab_size=32, num_layers=1, embed_dim=32, num_heads=4,
                            num_kv_heads=2, mlp_dim=32, encoding="rope", attention="pallas",
                            block_size=16)
    model = numpy_model(cfg)  # NumPy-drawn parameters: no sampler compiled per shape
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 32, (2, 19)), jnp.int32)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    step = nnx.jit(lambda m, t, c: m(t, cache=c))
    cache = init_cache(model, 2, 32)
    outs = []
    out, cache = step(model, tokens[:, :14], cache)
    outs.append(out)
    for t in range(14, 19):
        out, cache = step(model, tokens[:, t:t + 1], cache)
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, atol=2e-5)


@pytest.mark.parametrize("name", ["alibi", "kerple", "t5"])
def test_the_kernel_checks_the_bias_head_count_as_dense_does(name):
    enc = base.for_model(name, embed_dim=2 * D, num_heads=2, head_dim=D)
    q, k, v = _qkv(1, 8, 8)
    pos = jnp.arange(8)
    with pytest.raises(ValueError, match=f"'{name}' gives a bias with 2 heads but the "
                                         "attention scores have num_heads=4"):
        attend(q, k, v, encoding=enc, params=enc.init(jax.random.key(0)), q_positions=pos,
               k_positions=pos, implementation="pallas")
    assert "num_heads=2 but the attention has num_heads=4" in unsupported_reason(
        enc, platform="cuda", head_dim=D, num_heads=H, num_kv_heads=K)


@pytest.mark.parametrize("implementation", ["pallas", "blockwise", "auto"])
def test_empty_batch_and_empty_length_give_zeros_like_dense(implementation):
    enc = posenc_jax.get("alibi", num_heads=H)
    for b, lq, lk in ((0, 8, 8), (2, 0, 8), (2, 8, 0)):
        q, k, v = _qkv(b, lq, lk)
        out = jit(lambda q, k, v, lq=lq, lk=lk: attend(
            q, k, v, encoding=enc, params={}, q_positions=jnp.arange(lq),
            k_positions=jnp.arange(lk), implementation=implementation))(q, k, v)
        assert out.shape == (b, lq, H, D) and not np.any(np.asarray(out))


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple"])
def test_int64_positions_near_2_31_do_not_wrap(name):
    """The three are relative: at positions 2^31 - 12 .. 2^31 + 11 (int64) the kernel and
    dense give what dense gives at 0 .. 23 (int32). T5's dense side had cast int64 positions
    to int32 before its saturating k - q, so the keys past 2^31 wrapped to -2^31 (0.025 from
    the kernel, which rebases; the xfail this replaces)."""
    enc = base.for_model(name, embed_dim=H * D, num_heads=H, head_dim=D)
    q, k, v = _qkv(1, 24, 24)
    params = jax.tree.map(jnp.float32, enc.init(jax.random.key(0)))
    exact = jit(lambda *a: _dense(enc, params, *a, jnp.arange(24), jnp.arange(24), True))(
        q, k, v)
    with jax.enable_x64(True):  # positions closed over: concrete, so the kernel's span check runs
        pos = jnp.arange(24, dtype=jnp.int64) + (2**31 - 12)
        out = jit(lambda *a: attend(*a, encoding=enc, params=params, q_positions=pos,
                                        k_positions=pos, implementation="pallas", block_q=16,
                                        block_k=16))(q, k, v)
        ref = jit(lambda *a: _dense(enc, params, *a, pos, pos, True))(q, k, v)
    np.testing.assert_allclose(ref, exact, atol=2e-5)
    np.testing.assert_allclose(out, exact, atol=2e-5)


def test_int64_positions_farther_apart_than_int32_are_refused_by_the_kernel():
    """A batch row spanning more than 2^31 - 1 cannot be rebased into int32: refused, with
    the row and its span in the message, never a wrapped distance."""
    enc = posenc_jax.get("alibi", num_heads=H)
    q, k, v = _qkv(2, 4, 4)
    with jax.enable_x64(True):
        near = jnp.arange(4, dtype=jnp.int64)
        pos = jnp.stack([near, near.at[3].set(2**32)])
        with pytest.raises(ValueError, match=r"span \[0, 4294967296\] in batch row 1, more "
                                             r"than the Pallas kernel's int32 positions hold"):
            attend(q, k, v, encoding=enc, params={}, q_positions=pos, k_positions=pos,
                   implementation="pallas")


def _lowered_with_params(name, platform):
    enc = base.for_model(name, embed_dim=H * 64, num_heads=H, head_dim=64)
    params = jax.eval_shape(enc.init, jax.random.key(0))
    q = jax.ShapeDtypeStruct((1, 256, H, 64), jnp.bfloat16)
    pos = jnp.arange(256, dtype=jnp.int32)[None]

    def f(q, p):
        out, vjp = jax.vjp(lambda q, p: flash_attention(
            q, q, q, encoding=enc, params=p, q_positions=pos, k_positions=pos, causal=True),
            q, p)
        return vjp(out)

    return jax.jit(f).trace(q, params).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("name", ["fire", "kerple"])
def test_rank_0_and_rank_1_parameters_cross_lower_for_tpu(name):
    text = _lowered_with_params(name, "tpu")
    assert "tpu_custom_call" in text and "posenc_flash_dkv_kernel" in text


def test_fire_on_triton_is_declared_unsupported_with_the_reason():
    enc = base.for_model("fire", embed_dim=H * 64, num_heads=H, head_dim=64)
    reason = unsupported_reason(enc, platform="cuda", head_dim=64, num_heads=H)
    assert "does not lower for cuda with encoding 'fire'" in reason and "slice" in reason
    assert unsupported_reason(enc, platform="cpu", head_dim=64, num_heads=H) is None
