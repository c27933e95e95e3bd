"""Context parallelism on 8 fake CPU devices: a (data = 2, context = 4) mesh equals one device.

- ring and all-gather attention, with zig-zag load balancing, packed documents whose positions
  restart, GQA (4 query heads, 2 kv heads): the output and the gradients of q, k, v and of
  every encoding parameter (T5's table, FIRE's MLP) equal one-device dense attention;
- the sliding window (visible iff q_pos - k_pos < window) across shards equals one device's
  blockwise attention (with KERPLE's parameter gradients);
- zig-zag order: a permutation whose device i holds chunks i and 2N - 1 - i, undone by restore;
- cross-lowering for cuda and tpu: the ring's collective-permute is there, each step's Pallas
  kernel (Triton / Mosaic custom calls: forward, dq, dk/dv), and no tensor inside the
  per-device computation has the full length (the all-gather's does: the check can fail).
The kernel-step ring's values and gradients: tests/model/test_context_parallel_kernel.py.
"""

import re

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from jax.sharding import AxisType

from posenc_jax.encodings.base import for_model
from posenc_jax.model import context_parallel as cp
from posenc_jax.model import load_balance as lb
from posenc_jax.model.attention import attend
from posenc_jax.model.blockwise import attend_blockwise

B, L, H, K, D, N = 2, 64, 4, 2, 16, 4
CHUNK = L // N
jit = jax.jit  # compiled with the suite's cheap XLA:CPU pipeline (tests/conftest.py)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, N), ("data", "context"), axis_types=(AxisType.Auto,) * 2)


def packed_inputs():
    """q, k, v and packed documents: row 0 two documents, row 1 three; positions restart."""
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (B, L, H, D))
    k = jax.random.normal(keys[1], (B, L, K, D))
    v = jax.random.normal(keys[2], (B, L, K, D))
    cot = jax.random.normal(keys[3], (B, L, H, D))
    seg = np.ones((B, L), np.int32)
    pos = np.tile(np.arange(L, dtype=np.int32), (B, 1))
    for row, starts in ((0, (23,)), (1, (9, 41))):
        for i, s in enumerate(starts):
            seg[row, s:] = i + 2
            pos[row, s:] = np.arange(L - s)
    return q, k, v, cot, jnp.asarray(pos), jnp.asarray(seg)


def value_and_grads(fn, cot, *args):
    out, vjp = jax.vjp(fn, *args)
    return out, vjp(cot)


def parallel(encoding, mesh, mode, pos, seg, window=None, **kw):
    """Rotate at global positions, zig-zag reorder, context attention, restore the order
    (`kw`: more `context_attention` arguments, e.g. step="kernel")."""

    def fn(q, k, v, params):
        q, k = encoding.rotate(params, q, k, pos, pos)
        r = lambda x: lb.reorder(x, N)
        out = cp.context_attention(
            r(q), r(k), r(v), encoding=encoding, params=params, q_positions=r(pos),
            k_positions=r(pos), q_segment_ids=r(seg), k_segment_ids=r(seg), window=window,
            mesh=mesh, batch_axes=("data",), mode=mode, block_q=CHUNK, block_k=CHUNK, **kw)
        return lb.restore(out, N)

    return fn


def assert_close(got, want, what):
    paths, want_leaves = zip(*jax.tree_util.tree_flatten_with_path(want)[0])
    for path, g, w in zip(paths, jax.tree.leaves(got), want_leaves, strict=True):
        scale = max(1.0, float(jnp.max(jnp.abs(w))))
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5 * scale, rtol=0,
                                   err_msg=f"{what} {jax.tree_util.keystr(path)}")


@pytest.mark.parametrize("name,mode", [("rope", "ring"), ("alibi", "ring"), ("t5", "ring"),
                                       ("fire", "ring"), ("t5", "all_gather")])
def test_context_mesh_equals_one_device(mesh, name, mode):
    enc = for_model(name, {}, embed_dim=H * D, num_heads=H, head_dim=D)
    params = enc.init(jax.random.key(1))
    q, k, v, cot, pos, seg = packed_inputs()

    def reference(q, k, v, params):
        q, k = enc.rotate(params, q, k, pos, pos)
        return attend(q, k, v, encoding=enc, params=params, q_positions=pos, k_positions=pos,
                      q_segment_ids=seg, k_segment_ids=seg)

    want = jit(lambda *a: value_and_grads(reference, cot, *a))(q, k, v, params)
    with jax.set_mesh(mesh):
        got = jit(lambda *a: value_and_grads(parallel(enc, mesh, mode, pos, seg), cot, *a)
                      )(q, k, v, params)
    assert_close(got[0], want[0], f"{name} {mode} output")
    assert_close(got[1], want[1], f"{name} {mode} gradient")
    if params:  # the parameter gradients are not trivially zero
        assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want[1][3])) > 1e-3


def test_sliding_window_across_shards(mesh):
    """KERPLE (learned params) with a window shorter than a chunk: ring = one device's
    blockwise attention, values and all gradients."""
    enc = for_model("kerple", {}, embed_dim=H * D, num_heads=H, head_dim=D)
    params = enc.init(jax.random.key(1))
    q, k, v, cot, pos, seg = packed_inputs()
    window = 7  # most cross-shard pairs fall outside it

    def reference(q, k, v, params):
        return attend_blockwise(q, k, v, encoding=enc, params=params, q_positions=pos,
                                k_positions=pos, causal=True, q_segment_ids=seg,
                                k_segment_ids=seg, k_mask=None, block_q=16, block_k=16,
                                window=window)

    want = jit(lambda *a: value_and_grads(reference, cot, *a))(q, k, v, params)
    with jax.set_mesh(mesh):
        got = jit(lambda *a: value_and_grads(
            parallel(enc, mesh, "ring", pos, seg, window), cot, *a))(q, k, v, params)
    assert_close(got, want, "windowed ring")
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want[1][3])) > 1e-3
    full = attend(q, k, v, encoding=enc, params=params, q_positions=pos, k_positions=pos,
                  q_segment_ids=seg, k_segment_ids=seg)
    assert float(jnp.max(jnp.abs(full - want[0]))) > 1e-2  # the window changed the result


@given(shards=st.integers(1, 6), chunk=st.integers(1, 5))
def test_zigzag_order_is_balanced_permutation(shards, chunk):
    length = 2 * shards * chunk
    order = lb.zigzag_order(length, shards)
    assert sorted(order.tolist()) == list(range(length))
    for i in range(shards):
        local = order[i * length // shards:(i + 1) * length // shards]
        np.testing.assert_array_equal(local, lb.chunk_indices(length, shards, i))
        chunks = sorted(set((local // chunk).tolist()))
        assert chunks == sorted({i, 2 * shards - 1 - i})
        # causal work (keys visible to each query, summed) is the same on every device
        assert int(np.sum(local + 1)) == int(np.sum(lb.chunk_indices(length, shards, 0) + 1))
    x = np.arange(3 * length).reshape(3, length)
    np.testing.assert_array_equal(lb.restore(lb.reorder(x, shards), shards), x)


def test_errors_name_the_values(mesh):
    with pytest.raises(ValueError, match=r"length=12, shards=4 \(2 \* shards = 8\)"):
        lb.zigzag_order(12, 4)
    with pytest.raises(ValueError, match=r"shard must be in \[0, 4\), got shard=4"):
        lb.chunk_indices(16, 4, 4)
    enc = for_model("alibi", {}, embed_dim=H * D, num_heads=H, head_dim=D)
    x = jnp.zeros((2, 10, H, D))
    p = jnp.arange(10)[None]
    with pytest.raises(ValueError, match="mode"):
        cp.context_attention(x, x, x, encoding=enc, params={}, q_positions=p, k_positions=p,
                             mesh=mesh, mode="ulysses")
    with pytest.raises(ValueError, match=r"size 4 needs the length divisible by it, got "
                                         r"length=10"):
        cp.context_attention(x, x, x, encoding=enc, params={}, q_positions=p, k_positions=p,
                             mesh=mesh)


_CALL = re.compile(r"(?<!custom_)call @([\w$.]+)")  # a func.call, not a custom_call


def _per_device_text(text: str) -> str:
    """What runs per device in a lowered module: the bodies of @main's manual computations and
    every private function they call (transitively); @main's own ops are global-shaped."""
    funcs = dict(re.findall(r"func\.func (?:public|private) @(\w+)(.*?)\n  }\n", text, re.DOTALL))
    parts = re.findall(r"manual_axes=\{[^}]*\}(.*?)sdy\.return", funcs["main"], re.DOTALL)
    seen: set[str] = set()
    todo = [name for part in parts for name in _CALL.findall(part)]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += _CALL.findall(funcs[name])
    return "".join(parts) + "".join(funcs[name] for name in seen)


KERNEL_CALLS = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}


@pytest.fixture(scope="module")
def traced_grads(mesh):
    """T5's ring and all-gather gradients, traced once (tracing is platform-free); each
    platform's test lowers them for itself."""
    enc = for_model("t5", {}, embed_dim=H * D, num_heads=H, head_dim=D)
    params = enc.init(jax.random.key(1))
    q, k, v, cot, pos, seg = packed_inputs()
    traced = {}
    for mode in ("ring", "all_gather"):
        fn = parallel(enc, mesh, mode, pos, seg)
        loss = lambda *a: jnp.sum(fn(*a) * cot)  # noqa: B023
        with jax.set_mesh(mesh):
            traced[mode] = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(q, k, v, params)
    return traced


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_ring_lowering_has_collective_and_no_full_length_kv(mesh, traced_grads, platform):
    texts = {}
    for mode, traced in traced_grads.items():
        with jax.set_mesh(mesh):
            texts[mode] = traced.lower(lowering_platforms=(platform,)).as_text()
    full = re.compile(rf"tensor<(?:\d+x)*{L}x")  # any axis of length L: a full-length array
    ring = _per_device_text(texts["ring"])
    assert "collective_permute" in ring
    assert f"tensor<1x{CHUNK}x{K}x{D}xf32>" in ring  # the per-device K/V chunk
    assert not full.search(ring), full.search(ring)
    gathered = _per_device_text(texts["all_gather"])
    assert "all_gather" in gathered and full.search(gathered)  # the check can fail
    for text in (ring, gathered):  # each step runs the Pallas kernel, forward and backward
        assert KERNEL_CALLS[platform] in text
        for kernel in ("fwd", "dq", "dkv"):
            assert f"posenc_flash_{kernel}_kernel" in text
