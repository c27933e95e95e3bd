"""The kernel lowers for cuda (Triton) and tpu (Mosaic) at the shapes real models use: head
dims {40, 64, 80, 96, 128, 256} x rotary {full, 0.25} x KV heads {1, H/2, H} x window {None,
512}, forward and backward, each with the kernel's custom calls and no [L, L] tensor; and the
interpret-mode values and gradients equal dense attention at D = 80 and 96 with partial
rotary, GQA and a window.

Cheap: abstract arrays (nothing allocated), L = 1024, one lowering per case and platform,
about 0.3-3 s each on a 2-core host. The suite lowers a pairwise cover of the matrix (18 of
the 72 cases: every value of each factor with every value of each other factor at least once,
checked by `test_the_cover_holds_every_pair`); POSENC_TEST_FULL=1 lowers all 72 (144
lowerings, ~8 minutes on 2 cores). Tolerances as tests/model/test_pallas.py.
"""

import functools
import itertools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_helpers import assert_close, normal, out_and_grads

import posenc_jax
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.explicit import attend_explicit
from posenc_jax.model.kernels import flash_attention, unsupported_reason
from posenc_jax.model.kernels.static import Static
from posenc_jax.model.kernels.vjp import visibility

H, L = 4, 1024
CALLS = ("__gpu$xla.gpu.triton", "tpu_custom_call")


def _rope(d, rotary):
    return posenc_jax.get("rope", head_dim=d, **({} if rotary == "full" else
                                                  {"partial_rotary_factor": float(rotary)}))


def _traced(d, rotary, kv, window):
    """The forward and backward program of one case, traced once (abstract arrays); each
    platform lowers it (`.lower(lowering_platforms=...)`)."""
    enc = _rope(d, rotary)
    rotation = enc.kernel_rotation({})
    q = jax.ShapeDtypeStruct((1, L, H, d), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, L, kv, d), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((1, L), jnp.int32)

    def f(q, k, v, pos):
        out, vjp = jax.vjp(lambda q, k, v: flash_attention(
            q, k, v, encoding=enc, params={}, q_positions=pos, k_positions=pos, causal=True,
            rotation=rotation, window=window), q, k, v)
        return vjp(out)

    return jax.jit(f).trace(q, k, k, pos)


FACTORS = {"d": (40, 64, 80, 96, 128, 256), "rotary": ("full", "0.25"), "kv": (1, H // 2, H),
           "window": (None, 512)}


def _pairwise_cover() -> list[tuple]:
    """18 cases: head dim i, KV choice j; rotary and window alternate so every pair of
    values of any two factors occurs (a covering array of strength 2)."""
    d, rot, kv, win = FACTORS.values()
    return [(d[i], rot[(i + j) % 2], kv[j], win[(j + i // 2) % 2])
            for i in range(len(d)) for j in range(len(kv))]


CASES = (list(itertools.product(*FACTORS.values())) if os.environ.get("POSENC_TEST_FULL") == "1"
         else _pairwise_cover())


def test_the_cover_holds_every_pair():
    cover = _pairwise_cover()
    for (a, va), (b, vb) in itertools.combinations(enumerate(FACTORS.values()), 2):
        assert {(c[a], c[b]) for c in cover} == set(itertools.product(va, vb)), (a, b)


@pytest.mark.slow
@pytest.mark.parametrize(("d", "rotary", "kv", "window"), CASES)
def test_kernel_cross_lowers_for_cuda_and_tpu(d, rotary, kv, window):
    traced = _traced(d, rotary, kv, window)
    for platform, call in zip(("cuda", "tpu"), CALLS):
        text = traced.lower(lowering_platforms=(platform,)).as_text()
        assert call in text
        for kernel in ("fwd", "dq", "dkv"):
            assert f"posenc_flash_{kernel}_kernel" in text
        assert not re.search(rf"(?<![0-9]){L}x{L}x", text)


def test_unsupported_reason_is_none_at_the_shapes_that_lower_and_names_the_case_otherwise():
    enc = _rope(80, "0.25")
    for platform in ("cuda", "tpu"):
        assert unsupported_reason(enc, platform=platform, head_dim=80, num_heads=H,
                                  num_kv_heads=2, window=512) is None
    with pytest.raises(ValueError, match="platform must be one of 'cuda', 'tpu', 'cpu'"):
        unsupported_reason(enc, platform="gpu", head_dim=80, num_heads=H)
    shaw = posenc_jax.get("shaw", head_dim=80, max_relative_position=4)
    assert "'shaw'" in unsupported_reason(shaw, platform="cuda", head_dim=80, num_heads=H)


def _reference(enc, q, k, v, pos, window):
    qr, kr = enc.rotate({}, q, k, pos, pos)
    p = pos[0]
    mask = (p[None, :] <= p[:, None]) & (p[:, None] - p[None, :] < window)
    return attend_explicit(qr, kr, v, encoding=enc, params={}, q_positions=pos,
                           k_positions=pos, mask=mask[None, None], scale=1 / np.sqrt(q.shape[-1]))


@functools.cache
def _interpret_pair(d, rotary, cpu_kernel):
    """(kernel, dense) value-and-gradient programs of one case (kernel_helpers.out_and_grads);
    L = 70 in 16-blocks, H = 4 over K = 2, window 24, positions from 5."""
    enc, pos = _rope(d, rotary), jnp.arange(70, dtype=jnp.int32)[None] + 5

    def kernel(q, k, v):
        return flash_attention(q, k, v, encoding=enc, params={}, q_positions=pos,
                               k_positions=pos, causal=True, rotation=enc.kernel_rotation({}),
                               block_q=16, block_k=16, window=24, cpu_kernel=cpu_kernel)

    return out_and_grads(kernel), _dense_program(d, rotary)


@functools.cache
def _dense_program(d, rotary):  # one per case: the gpu and tpu tests share it
    enc, pos = _rope(d, rotary), jnp.arange(70, dtype=jnp.int32)[None] + 5
    return out_and_grads(lambda q, k, v: _reference(enc, q, k, v, pos, 24))


@pytest.mark.parametrize("cpu_kernel", ["gpu", "tpu"])
@pytest.mark.parametrize(("d", "rotary"), [(80, "0.25"), (96, "0.5")])
def test_interpret_values_and_gradients_equal_dense_with_partial_rotary_gqa_and_window(
        d, rotary, cpu_kernel):
    """L=70 in 16-blocks, H=4 over K=2, window 24 (keys 23 back): several key blocks are
    skipped on both sides of the diagonal band. Output and gradients in one program a path."""
    q, k, v = normal(0, (2, 70, H, d), (2, 70, 2, d), (2, 70, 2, d))
    w = jnp.cos(jnp.arange(d, dtype=jnp.float32)).reshape(1, 1, 1, d)
    kernel, dense = _interpret_pair(d, rotary, cpu_kernel)
    assert_close(kernel(w, q, k, v), dense(w, q, k, v))


def test_window_rejects_a_non_positive_value():
    enc = _rope(64, "full")
    x = jnp.zeros((1, 8, 1, 64))
    with pytest.raises(ValueError, match="window"):
        flash_attention(x, x, x, encoding=enc, params={}, q_positions=jnp.arange(8)[None],
                        k_positions=jnp.arange(8)[None], causal=True, window=0)


def test_window_block_skipping_keeps_only_the_diagonal_band():
    """L=4096 in 128-blocks with window 512: a query block sees its own block and the 4
    before it (5 of 32), against up to 32 with causal attention alone."""
    n, b = 4096, 128
    pos = jnp.arange(n, dtype=jnp.int32)
    aux = {"qpos": pos[None, :, None], "kpos": pos[None, None, :],
           "kvalid": jnp.ones((1, 1, n), jnp.int32)}

    def vis(window):
        st = Static(causal=True, segments=False, scale=1.0, num_heads=1, groups=1,
                    head_dim=64, rotary=0, encoding=None, param_tree=None, block_q=b,
                    block_k=b, window=window)
        return np.asarray(visibility(st, aux, b, b))[0]

    band, causal = vis(512), vis(None)
    assert causal.sum() == 32 * 33 // 2
    assert band.sum() == sum(min(i + 1, 5) for i in range(32))
    i, j = np.nonzero(band)
    assert np.all((i - j >= 0) & (i - j <= 4))


def test_explicit_pallas_with_a_shape_the_gpu_kernel_cannot_take_fails_at_config_time(
        monkeypatch):
    """On a GPU host (the backend faked: the check only cross-lowers), T5 with 6 heads needs
    its [32, 6] table in the kernel, not a power-of-two array for Triton: a ValueError at
    construction naming the shape; on this CPU host the same config is fine (interpret)."""
    kw = dict(vocab_size=8, num_layers=1, embed_dim=6 * 16, num_heads=6, mlp_dim=32,
              encoding="t5", attention="pallas")
    TransformerConfig(**kw)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(ValueError, match=r"attention='pallas': .*cuda.*'t5'.*head_dim=16, "
                                         r"num_heads=6.*\(32, 6\).*use attention='auto'"):
        TransformerConfig(**kw)
