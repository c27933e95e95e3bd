"""Sinks, sliding windows, chunks and sink tokens under context parallelism (8 fake CPU
devices, a (data = 2, context = 4) mesh, zig-zag order, packed documents, GQA).

The ring and the all-gather equal one device's dense attention, output and the gradients of
q, k, v, the encoding's parameters (KERPLE's) and the learned sinks: the sink enters the
denominator once, after the merge, not once per ring step (a per-step sink would count it
N = 4 times; `test_the_sink_enters_once` shows that result differs). The blockwise step
(what a CPU host runs) for both modes; the kernel step (interpret mode) for the ring.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from test_context_parallel import H, N, assert_close, jit, packed_inputs, parallel

from posenc_jax.encodings.base import for_model
from posenc_jax.model import context_parallel as cp
from posenc_jax.model.attention import attend

D = 16
LOCAL = {"window": 11, "chunk_size": 24, "sink_tokens": 3}  # chunks end inside shards


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, N), ("data", "context"), axis_types=(AxisType.Auto,) * 2)


def _setup():
    enc = for_model("kerple", {}, embed_dim=H * D, num_heads=H, head_dim=D)
    params = enc.init(jax.random.key(1))
    q, k, v, cot, pos, seg = packed_inputs()
    sinks = jnp.asarray([1.5, -0.5, 0.0, 3.0], jnp.float32)
    return enc, params, (q, k, v, sinks), cot, pos, seg


def _reference(enc, pos, seg, **kw):
    def f(q, k, v, sinks, params):
        return attend(q, k, v, encoding=enc, params=params, q_positions=pos, k_positions=pos,
                      q_segment_ids=seg, k_segment_ids=seg, sinks=sinks, **kw)
    return f


def _parallel(enc, mesh, mode, pos, seg, **kw):
    def f(q, k, v, sinks, params):
        return parallel(enc, mesh, mode, pos, seg, sinks=sinks, **kw)(q, k, v, params)
    return f


def _value_and_grads(fn, cot, args, params):
    out, vjp = jax.vjp(fn, *args, params)
    return out, vjp(cot)


@pytest.mark.parametrize("mode,step,local", [
    ("ring", "blockwise", LOCAL), ("all_gather", "blockwise", LOCAL),
    ("ring", "blockwise", {}), ("ring", "kernel", LOCAL)])
def test_ring_and_all_gather_with_sinks_windows_and_chunks_equal_one_device(
        mesh, mode, step, local):
    enc, params, args, cot, pos, seg = _setup()
    want = jit(lambda a, p: _value_and_grads(_reference(enc, pos, seg, **local), cot, a, p))(
        args, params)
    with jax.set_mesh(mesh):
        got = jit(lambda a, p: _value_and_grads(
            _parallel(enc, mesh, mode, pos, seg, step=step, **local), cot, a, p))(args, params)
    assert_close(got, want, f"{mode} {step} {sorted(local)}")
    d_sinks = want[1][3]
    assert float(jnp.abs(d_sinks).min()) > 1e-3  # every head's sink gets a gradient


def test_the_sink_enters_once(mesh):
    """Adding the sink in every one of the N steps would weigh it N times: the reference with
    sinks + log(N) (the same as N copies of each sink) differs from what the ring gives."""
    enc, params, (q, k, v, sinks), _, pos, seg = _setup()
    with jax.set_mesh(mesh):
        ring = jit(lambda *a: _parallel(enc, mesh, "ring", pos, seg, **LOCAL)(*a))(
            q, k, v, sinks, params)
    once = _reference(enc, pos, seg, **LOCAL)(q, k, v, sinks, params)
    n_times = _reference(enc, pos, seg, **LOCAL)(q, k, v, sinks + np.log(N), params)
    np.testing.assert_allclose(ring, once, atol=2e-5)
    assert float(jnp.abs(n_times - once).max()) > 1e-2


def test_context_attention_refuses_bad_settings_naming_the_key(mesh):
    enc = for_model("alibi", {}, embed_dim=H * D, num_heads=H, head_dim=D)
    x = jnp.zeros((2, 16, H, D))
    p = jnp.arange(16)[None]
    kw = {"encoding": enc, "params": {}, "q_positions": p, "k_positions": p, "mesh": mesh}
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got chunk_size=-4"):
        cp.context_attention(x, x, x, chunk_size=-4, **kw)
    with pytest.raises(ValueError, match=r"sinks must have shape \[H=4\]"):
        cp.context_attention(x, x, x, sinks=jnp.zeros((2,)), **kw)
    with pytest.raises(ValueError, match="context_step"):
        cp.context_attention(x, x, x, step="dense", **kw)
