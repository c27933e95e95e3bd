"""The Pallas kernel (attention="pallas", interpret mode on CPU) equals dense attention, values
and gradients (q, k, v and every encoding param), for every scheme it serves; RoPE is applied
in-kernel from raw q/k; a KV-cache decode equals the full forward; errors name the way out.

Tolerances: float32 inputs, 2e-5 absolute on values and 1e-4 relative-to-max on gradients:
both paths accumulate in float32 but sum in different orders (online softmax over blocks
vs one softmax), so they differ by float32 rounding (observed <= 2e-5). bfloat16 inputs: the
kernel rounds p to bfloat16 before p.v (as FlashAttention does) where XLA's dense path
rounds the normalised probabilities, so outputs differ by about one bfloat16 ulp of |out|
<~ 3: 3e-2 absolute (observed ~1e-2); gradients compared relative to their max, 5e-2.
Interpret mode is slow, so shapes are small: L=100 (not a multiple of the 64-blocks).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_helpers import assert_close, normal, out_and_grads

import posenc_jax
from posenc_jax.encodings import base
from posenc_jax.encodings.capabilities import ElementwiseBias
from posenc_jax.model.attention import attend, rotates_inside
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.kernels import flash_attention

H, K, D, L = 4, 2, 16, 100
HYPER = {"nope": {}, "rope": {"head_dim": D}, "alibi": {"num_heads": H},
         "t5": {"num_heads": H, "num_buckets": 8, "max_distance": 16}}


def _elementwise_schemes():
    """Every registered scheme with an elementwise bias (KERPLE, Sandwich, ...), built for H."""
    out = []
    for name in base.names():
        if name in HYPER or name in ("learned", "sinusoidal"):
            continue
        enc = base.for_model(name, embed_dim=H * D, num_heads=H, head_dim=D)
        if isinstance(enc, ElementwiseBias):
            out.append(name)
    return out


def _encoding(name):
    if name in HYPER:
        enc = posenc_jax.get(name, **HYPER[name])
    else:
        enc = base.for_model(name, embed_dim=H * D, num_heads=H, head_dim=D)
    params = enc.init(jax.random.key(3))
    return enc, jax.tree.map(lambda t: t * 20.0 if t.ndim > 1 else t, params)


def _qkv(b, lq, lk, dtype=jnp.float32):
    return normal(0, (b, lq, H, D), (b, lk, K, D), (b, lk, K, D), dtype=dtype)


def _pair(enc, cpu_kernel="gpu", **kw):
    """(kernel, dense) functions of (q, k, v, params) taking RAW q and k: the kernel rotates
    in-kernel where the scheme declares `kernel_rotation`, dense calls the rotate hook."""
    raw = rotates_inside(enc, "pallas")

    def rotate(q, k, p):
        return enc.rotate(p, q, k, kw["q_positions"], kw["k_positions"])

    def kernel(q, k, v, p):
        if not raw:
            q, k = rotate(q, k, p)
        if cpu_kernel == "tpu":  # the TPU kernel structure, in interpret mode
            rotation = enc.kernel_rotation(p) if raw else None
            return flash_attention(q, k, v, encoding=enc, params=p, rotation=rotation,
                                   block_q=64, block_k=64, cpu_kernel="tpu", **kw)
        return attend(q, k, v, encoding=enc, params=p, implementation="pallas", block_q=64,
                      block_k=64, rotated=not raw, **kw)

    def dense(q, k, v, p):
        q, k = rotate(q, k, p)
        return attend(q, k, v, encoding=enc, params=p, implementation="dense", **kw)

    return kernel, dense


def _check(enc, params, qkv, kw, atol=2e-5, gtol=1e-4, cpu_kernel="gpu"):
    kernel, dense = _pair(enc, cpu_kernel, **kw)
    w = jnp.cos(jnp.arange(D, dtype=jnp.float32)).reshape(1, 1, 1, D)
    # one compiled program a path: the output and its vjp (the forward kernel traced once)
    got = out_and_grads(kernel)(w, *qkv, params)
    assert_close(got, out_and_grads(dense)(w, *qkv, params), atol=atol, gtol=gtol)
    return got[0]


def _packed(b):
    """Two packed documents per row, positions restarting at each (lengths 60 + 40, 30 + 70)."""
    cuts = [60, 30][:b]
    idx = np.arange(L)
    seg = np.stack([(idx >= c).astype(np.int32) for c in cuts])
    pos = np.stack([np.where(idx >= c, idx - c, idx) for c in cuts]).astype(np.int32)
    return jnp.asarray(pos), jnp.asarray(seg)


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "t5", *_elementwise_schemes()])
def test_kernel_equals_dense_packed_causal_gqa(name):
    """Causal, GQA (H=4, K=2), two packed documents per row with restarting positions, L=100.
    T5 runs the TPU kernel structure (grid over key blocks, VMEM scratch, SMEM visibility,
    params gradient accumulated in a resident output block), the others the GPU one."""
    enc, params = _encoding(name)
    pos, seg = _packed(1)
    kw = {"q_positions": pos, "k_positions": pos, "q_segment_ids": seg, "k_segment_ids": seg,
          "causal": True}
    _check(enc, params, _qkv(1, L, L), kw, cpu_kernel="tpu" if name == "t5" else "gpu")


@pytest.mark.parametrize("name", ["t5"])
def test_kernel_equals_dense_bidirectional_offset_queries_and_empty_rows(name):
    """Cache-shaped call: 7 queries at positions 40.. over 100 key slots of which 90 are
    filled; bidirectional (T5's bidirectional buckets); the first query row of batch 1 sees
    no key at all (its segment id matches no key) -> zeros, finite gradients."""
    enc, params = _encoding(name)
    if name == "t5":
        enc = posenc_jax.get("t5", num_heads=H, num_buckets=8, max_distance=16,
                             bidirectional=True)
    qp = jnp.array([np.arange(40, 47), np.arange(-3, 4)], jnp.int32)
    kp = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (2, L))
    k_mask = jnp.broadcast_to(jnp.arange(L) < 90, (2, L))
    q_seg = jnp.array([[0] * 7, [5] + [0] * 6], jnp.int32)
    kw = {"q_positions": qp, "k_positions": kp, "k_mask": k_mask, "q_segment_ids": q_seg,
          "k_segment_ids": jnp.zeros((2, L), jnp.int32), "causal": False}
    out = _check(enc, params, _qkv(2, 7, L), kw)
    assert np.all(np.asarray(out)[1, 0] == 0.0)


def test_kernel_rotation_interleaved_partial_with_attention_factor():
    """In-kernel RoPE beyond the default: interleaved pairs (permuted to halves for the
    kernel), partial rotary (8 of 16 features; the rest pass through), YaRN's frequencies
    and attention factor (cos and sin scaled), bidirectional."""
    enc = posenc_jax.get("rope", head_dim=D, rotary_dim=8, layout="interleaved",
                         scaling={"rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 32})
    assert rotates_inside(enc, "pallas")
    assert float(enc.kernel_rotation({}).attention_factor) != 1.0
    pos = jnp.arange(L, dtype=jnp.int32)
    _check(enc, {}, _qkv(1, L, L), {"q_positions": pos, "k_positions": pos, "causal": False})


def test_kernel_equals_dense_in_bfloat16():
    enc, params = _encoding("rope")
    pos = jnp.arange(L, dtype=jnp.int32)
    kw = {"q_positions": pos, "k_positions": pos, "causal": True}
    _check(enc, params, _qkv(1, L, L, jnp.bfloat16), kw, atol=3e-2, gtol=5e-2)


def test_schemes_without_an_elementwise_bias_are_refused_with_the_alternative():
    shaw = posenc_jax.get("shaw", head_dim=D, max_relative_position=3)
    q, k, v = _qkv(1, 8, 8)
    pos = jnp.arange(8)
    with pytest.raises(ValueError, match="'shaw'.*use attention='dense' or 'blockwise'"):
        attend(q, k, v, encoding=shaw, params=shaw.init(jax.random.key(0)),
               q_positions=pos, k_positions=pos, implementation="pallas")
    with pytest.raises(ValueError, match="use attention='dense' or 'blockwise'"):
        TransformerConfig(vocab_size=8, num_layers=1, embed_dim=32, num_heads=2,
                                     mlp_dim=32, encoding="shaw", attention="pallas")
    assert not rotates_inside(shaw, "auto")
    alibi = posenc_jax.get("alibi", num_heads=H)
    with pytest.raises(TypeError, match="q_positions must have an integer dtype"):
        attend(q, k, v, encoding=alibi, params={}, q_positions=pos * 0.5, k_positions=pos,
               implementation="pallas")
