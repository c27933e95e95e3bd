"""The kernel's block bookkeeping at its edges (issue 34) and its new masks (issue 31).

- `vjp.visibility` (which key blocks each query block reads) equals a brute-force count from
  the masks' definition for contiguous positions -- where the min / max test is exact, so a
  block read too many (an off-by-one at the window's edge: `<` for `<=`) fails as surely as
  one skipped too many -- over windows of a block +- 1, chunks aligned and not aligned to the
  blocks, sink tokens up to and past a block, and lengths the blocks do not divide (padded
  query rows repeat the last row: they widen no block's range; a query block of padding
  alone reads nothing);
- the kernel (interpret mode, both structures) equals dense attention, values and gradients
  (sinks included), at those edges;
- cross-lowering for cuda (Triton) and tpu (Mosaic) from this CPU host at the real shapes:
  gpt-oss (64 heads over 8, head dim 64, window 128, learned sinks) and Llama 4 (40 heads over
  8, head dim 128, chunk 8192 at L = 16k): forward, dq and dk/dv kernels, the sinks an input of
  the forward only, and the block skipping in the program: the [B, nq, nk] visibility it
  hands the kernels, here 4,160 of 16,384 TPU block pairs for Llama 4 (8,256 causal alone);
  and sinks with chunks, a window and sink tokens at every head dim the kernel takes.
Tolerances as tests/model/test_pallas.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_helpers import assert_close, normal, out_and_grads
from test_sinks_chunks import reference_mask

import posenc_jax
from posenc_jax.model.attention import attend
from posenc_jax.model.kernels import flash_attention
from posenc_jax.model.kernels.flash import chunk_ids, mask_rows
from posenc_jax.model.kernels.static import Static
from posenc_jax.model.kernels.vjp import padded_length, visibility

EDGES = [  # (length, block, window, chunk_size, sink_tokens)
    (64, 16, 16, None, 0), (64, 16, 17, None, 0), (64, 16, 15, None, 0), (64, 16, 1, None, 0),
    (50, 16, 16, None, 0), (50, 16, 33, None, 0), (50, 16, None, 16, 0), (50, 16, None, 12, 0),
    (50, 16, None, 24, 0), (50, 16, 5, None, 16), (50, 16, 5, None, 17), (50, 16, 9, 12, 1),
    (37, 16, 100, None, 0), (37, 16, None, 64, 0), (33, 32, 31, 8, 3),
]


def _static(window, chunk_size, sink_tokens, length, block=16):
    return Static(causal=True, segments=False, scale=1.0, num_heads=1, groups=1, head_dim=16,
                  rotary=0, encoding=None, param_tree=None, block_q=block, block_k=block,
                  window=window, chunks=chunk_size is not None, sink_tokens=sink_tokens,
                  q_len=length)


def _visibility(length, block, window, chunk_size, sink_tokens, offset=0):
    pos = jnp.arange(length, dtype=jnp.int32)[None] + offset
    chunks = None if chunk_size is None else chunk_ids(pos, pos, chunk_size)
    padded = padded_length(length)[0]
    aux = mask_rows(pos, pos, None, None, None, chunks, batch=1, q_len=padded, k_len=padded)
    return np.asarray(visibility(_static(window, chunk_size, sink_tokens, length), aux, block,
                                 block))[0]


def _brute(length, block, window, chunk_size, sink_tokens, offset=0):
    pos = np.arange(length)[None] + offset
    mask = reference_mask(pos, pos, window=window, chunk_size=chunk_size,
                          sink_tokens=sink_tokens)[0]
    n = -(-padded_length(length)[0] // block)
    full = np.zeros((n * block, n * block), bool)
    full[:length, :length] = mask
    return full.reshape(n, block, n, block).any(axis=(1, 3)).astype(np.int32)


@pytest.mark.parametrize(("length", "block", "window", "chunk_size", "sink_tokens"), EDGES)
def test_block_visibility_is_exact_at_the_edges(length, block, window, chunk_size,
                                                sink_tokens):
    for offset in (0, 5):  # positions not starting at a block or chunk edge
        got = _visibility(length, block, window, chunk_size, sink_tokens, offset)
        want = _brute(length, block, window, chunk_size, sink_tokens, offset)
        np.testing.assert_array_equal(got, want, err_msg=f"offset {offset}")


def _edge_case(length, window, chunk_size, sink_tokens, cpu_kernel=None):
    """Inputs (cotangent and sinks too) and the attention of one edge case: the kernel with
    `cpu_kernel`'s structure, or dense (None); H = 2 over K = 1, D = 16, positions from 3."""
    h, kh, d = 2, 1, 16
    q, k, v, cot, sinks = normal(length, (1, length, h, d), (1, length, kh, d),
                                 (1, length, kh, d), (1, length, h, d), (h,))
    pos = jnp.arange(length, dtype=jnp.int32)[None] + 3
    kw = {"window": window, "chunk_size": chunk_size, "sink_tokens": sink_tokens}
    enc = posenc_jax.get("alibi", num_heads=h)

    def attention(q, k, v, s):
        if cpu_kernel is None:
            return attend(q, k, v, encoding=enc, params={}, q_positions=pos, k_positions=pos,
                          sinks=s, **kw)
        return flash_attention(q, k, v, encoding=enc, params={}, q_positions=pos,
                               k_positions=pos, causal=True, block_q=16, block_k=16,
                               cpu_kernel=cpu_kernel, sinks=s, **kw)

    return (cot, q, k, v, sinks), attention


@functools.cache
def _dense_at_edge(*case):
    """Dense output and gradients of a case, computed once for both kernel structures."""
    args, dense = _edge_case(*case)
    return out_and_grads(dense)(*args)


@pytest.mark.parametrize("cpu_kernel", ["gpu", "tpu"])
@pytest.mark.parametrize(("length", "window", "chunk_size", "sink_tokens"), [
    (50, 16, None, 0), (50, 5, None, 17), (50, None, 12, 0), (37, 9, 16, 1)])
def test_kernel_equals_dense_at_block_edges_values_and_gradients(cpu_kernel, length, window,
                                                                 chunk_size, sink_tokens):
    """Output and gradients (sinks included) in one compiled program a path."""
    case = (length, window, chunk_size, sink_tokens)
    args, kernel = _edge_case(*case, cpu_kernel=cpu_kernel)
    assert_close(out_and_grads(kernel)(*args), _dense_at_edge(*case))


REAL = {  # name: (L, H, K, D, attend kwargs)
    "gpt_oss": (4096, 64, 8, 64, {"window": 128, "sinks": True}),
    "llama4": (16384, 40, 8, 128, {"chunk_size": 8192}),
}


def _lowered(name, platform):
    length, h, kh, d, kw = REAL[name]
    q = jax.ShapeDtypeStruct((1, length, h, d), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, length, kh, d), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((1, length), jnp.int32)
    sinks = jax.ShapeDtypeStruct((h,), jnp.float32) if kw.get("sinks") else None
    enc = posenc_jax.get("rope", head_dim=d)
    local = {key: value for key, value in kw.items() if key != "sinks"}

    def f(q, k, v, pos, sinks):
        def attn(q, k, v, sinks):
            return flash_attention(q, k, v, encoding=enc, params={}, q_positions=pos,
                                   k_positions=pos, causal=True, sinks=sinks,
                                   rotation=enc.kernel_rotation({}), **local)
        out, vjp = jax.vjp(attn, q, k, v, sinks)
        return vjp(out)

    return jax.jit(f).trace(q, k, k, pos, sinks).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("platform,call,blocks", [("cuda", "__gpu$xla.gpu.triton", None),
                                                  ("tpu", "tpu_custom_call", 128)])
def test_real_shapes_cross_lower_with_sinks_chunks_and_block_skipping(name, platform, call,
                                                                      blocks):
    length, h, _, d, kw = REAL[name]
    text = _lowered(name, platform)
    assert call in text
    for kernel in ("fwd", "dq", "dkv"):
        assert f"posenc_flash_{kernel}_kernel" in text
    assert not f"{length}x{length}x" in text                     # no [L, L] tensor anywhere
    block = blocks or (64 if d <= 128 else 32)                   # the forward's key block
    n = length // block
    vis_type = f"tensor<{n}x1x{n}xi32>" if platform == "tpu" else f"tensor<1x{n}x{n}xi32>"
    assert vis_type in text                                      # the skipping table
    if kw.get("sinks"):
        assert f"tensor<1x{h}x{length}x1xf32>" in text           # the sink rows, forward input
    if platform == "tpu" and name == "llama4":
        vis = _visibility(length, 128, None, 8192, 0)
        assert vis.sum() == 2 * (64 * 65 // 2) == 4160 and vis.size == 16384


@pytest.mark.parametrize("d", [40, 64, 80, 96, 128, 256])
def test_sinks_and_chunks_lower_for_cuda_and_tpu_at_every_head_dim(d):
    """Every head dim the kernel takes (tests/model/test_kernel_lowering.py's), with learned
    sinks, chunks, a window and sink tokens at once, forward and backward, L = 1024."""
    length, h, kh = 1024, 4, 2
    enc = posenc_jax.get("rope", head_dim=d)
    q = jax.ShapeDtypeStruct((1, length, h, d), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, length, kh, d), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((1, length), jnp.int32)
    sinks = jax.ShapeDtypeStruct((h,), jnp.float32)

    def f(q, k, v, pos, sinks):
        out, vjp = jax.vjp(lambda q, k, v, s: flash_attention(
            q, k, v, encoding=enc, params={}, q_positions=pos, k_positions=pos, causal=True,
            rotation=enc.kernel_rotation({}), sinks=s, chunk_size=256, window=300,
            sink_tokens=4), q, k, v, sinks)
        return vjp(out)

    for platform, call in (("cuda", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call")):
        text = jax.jit(f).trace(q, k, k, pos, sinks).lower(
            lowering_platforms=(platform,)).as_text()
        assert call in text and all(f"posenc_flash_{n}_kernel" in text
                                    for n in ("fwd", "dq", "dkv")), (d, platform)
