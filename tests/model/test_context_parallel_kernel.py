"""The Pallas kernel as the block math of every context-parallel step (8 fake CPU devices).

- `flash_attention(..., return_lse=True)`: (out, lse) and their vjp -- a cotangent on lse too
  -- equal a float32 dense reference, rows that see no key included (lse -1e30, out 0);
- the ring with step="kernel" (interpret mode on CPU) on a (data = 2, context = 4) mesh, zig-zag
  order, packed documents, GQA: output and gradients of q, k, v and every encoding parameter
  equal one device's dense attention, for rope, alibi (with a sliding window of 7 < a chunk),
  t5 and fire;
- the step names are checked (ValueError naming the value and the choices).
Cross-lowering (the kernel's custom calls beside the collective-permute) is in
tests/model/test_context_parallel.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from kernel_helpers import jit, normal
from test_context_parallel import (
    D,
    H,
    K,
    N,
    assert_close,
    packed_inputs,
    parallel,
    value_and_grads,
)

from posenc_jax.encodings.base import for_model
from posenc_jax.model import context_parallel as cp
from posenc_jax.model.attention import attend
from posenc_jax.model.kernels import flash_attention
from posenc_jax.model.scores import build_mask, encoding_bias

NEG = np.float32(-1e30)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, N), ("data", "context"), axis_types=(AxisType.Auto,) * 2)


def dense_lse(q, k, v, enc, params, qp, kp, k_mask):
    """Causal dense (out, lse) in float32 at HIGHEST precision; a row with no key: 0, NEG."""
    h, g = q.shape[2], q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") * scale
    s = s + encoding_bias(enc, params, qp, kp, q * scale, h)
    mask = build_mask(qp, kp, causal=True, k_mask=k_mask)
    seen = jnp.any(mask, axis=-1)                                          # [B, 1, Lq]
    s = jnp.where(mask, s, -jnp.inf)
    m = jnp.where(seen, jnp.max(s, axis=-1), 0.0)
    p = jnp.where(mask, jnp.exp(s - m[..., None]), 0.0)
    l = jnp.sum(p, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", p / jnp.where(seen, l, 1.0)[..., None], v,
                     precision="highest")
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), NEG)
    return out, jnp.transpose(lse, (0, 2, 1))


@pytest.mark.slow  # ~25 s of CPU, nearly all compiling interpret mode (any shape)
def test_lse_entry_point_values_and_vjp_with_an_lse_cotangent():
    """Lk = 24 (padded to the kernel's blocks), keys from position 3: queries 0-2 see none;
    row 1 hides its last keys (k_mask)."""
    b, lq, lk = 2, 16, 24
    enc = for_model("t5", {}, embed_dim=H * D, num_heads=H, head_dim=D)
    params = enc.init(jax.random.key(1))
    q, k, v, d_out, d_lse = normal(2, (b, lq, H, D), (b, lk, K, D), (b, lk, K, D),
                                   (b, lq, H, D), (b, lq, H))
    qp = jnp.arange(lq)[None]
    kp = jnp.arange(lk)[None] + 3
    k_mask = jnp.ones((b, lk), bool).at[1, 18:].set(False)

    def kernel(q, k, v, params):
        return flash_attention(q, k, v, encoding=enc, params=params, q_positions=qp,
                               k_positions=kp, causal=True, k_mask=k_mask, block_q=16,
                               block_k=16, return_lse=True)

    def reference(q, k, v, params):
        return dense_lse(q, k, v, enc, params, qp, kp, k_mask)

    # the cotangents are arguments: one reference program serves both cotangents below
    got = jit(lambda c, *a: value_and_grads(kernel, c, *a))((d_out, d_lse), q, k, v, params)
    ref = jit(lambda c, *a: value_and_grads(reference, c, *a))
    want = ref((d_out, d_lse), q, k, v, params)
    assert got[0][0].dtype == got[0][1].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got[0][1][:, :3]), NEG)   # no key: lse -1e30
    np.testing.assert_array_equal(np.asarray(got[0][0][:, :3]), 0.0)   # and out 0
    assert_close(got, want, "kernel (out, lse)")
    # the lse cotangent matters: without it the reference's gradients differ
    plain = ref((d_out, jnp.zeros_like(d_lse)), q, k, v, params)
    assert float(jnp.max(jnp.abs(plain[1][0] - want[1][0]))) > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("name,window", [
    ("rope", None), ("alibi", 7), ("t5", None),
    pytest.param("fire", None, marks=pytest.mark.full)])  # fire: 76 s; its blockwise ring runs
def test_kernel_ring_equals_one_device(mesh, name, window):
    enc = for_model(name, {}, embed_dim=H * D, num_heads=H, head_dim=D)
    params = enc.init(jax.random.key(1))
    q, k, v, cot, pos, seg = packed_inputs()

    def reference(q, k, v, params):
        q, k = enc.rotate(params, q, k, pos, pos)
        return attend(q, k, v, encoding=enc, params=params, q_positions=pos, k_positions=pos,
                      q_segment_ids=seg, k_segment_ids=seg, window=window)

    want = jit(lambda *a: value_and_grads(reference, cot, *a))(q, k, v, params)
    with jax.set_mesh(mesh):
        got = jit(lambda *a: value_and_grads(
            parallel(enc, mesh, "ring", pos, seg, window, step="kernel"), cot, *a))(
                q, k, v, params)
    assert_close(got[0], want[0], f"{name} kernel ring output")
    assert_close(got[1], want[1], f"{name} kernel ring gradient")
    if params:  # the parameter gradients are not trivially zero
        assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want[1][3])) > 1e-3
    if window is not None:  # the window changed the result
        qr, kr = enc.rotate(params, q, k, pos, pos)
        full = attend(qr, kr, v, encoding=enc, params=params, q_positions=pos,
                      k_positions=pos, q_segment_ids=seg, k_segment_ids=seg)
        assert float(jnp.max(jnp.abs(full - want[0]))) > 1e-2


def test_step_is_checked(mesh):
    enc = for_model("alibi", {}, embed_dim=H * D, num_heads=H, head_dim=D)
    x = jnp.zeros((2, 16, H, D))
    p = jnp.arange(16)[None]
    with pytest.raises(ValueError, match=r"context_step.*'pallas'.*'auto', 'kernel', "
                                         r"'blockwise'"):
        cp.context_attention(x, x, x, encoding=enc, params={}, q_positions=p, k_positions=p,
                             mesh=mesh, step="pallas")
