"""Learned sinks, chunked attention and sink tokens in `attend` (issue 31).

- a float64 NumPy reference (its own mask and softmax-with-sink, written here): every backend
  that supports the case (dense, blockwise, the Pallas kernel in interpret mode) equals it on
  packed sequences whose positions restart, GQA (4 query heads over 2), odd lengths, a chunk
  or a window longer than the sequence, and rows that see no key but the sink;
- the backends' gradients of q, k, v and the sinks equal each other, and the sinks' gradient
  equals its closed form, -sum_rows p_sink * rowsum(cot * out);
- transformers' own attention functions (gpt-oss `eager_attention_forward` with sinks and a
  sliding window, Llama 4's with `chunked_causal_mask_function`), float64 goldens made by
  scripts/make_attention_golden.py: values and gradients, for every backend;
- bad values refused naming the key (a negative chunk, integer or misshapen sinks), and the
  records: a backend without sinks / chunks refuses them by name, "auto" never picks one.
Tolerances as tests/model/test_pallas.py (float32 against float64: 2e-5 values, 1e-4
relative gradients).
"""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc_jax
from posenc_jax.model import backends
from posenc_jax.model.attention import attend

B, H, K, D = 2, 4, 2, 16
GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "data" / "attention_golden.npz"
IMPLS = ("dense", "blockwise", "pallas")


def reference_mask(qp, kp, *, causal=True, qs=None, ks=None, k_mask=None, window=None,
                   chunk_size=None, sink_tokens=0):
    """bool [B, Lq, Lk] by the definitions in `attend`'s docstring, element by element."""
    b, lq, lk = qp.shape[0], qp.shape[1], kp.shape[1]
    out = np.zeros((b, lq, lk), bool)
    for r in range(b):
        for i in range(lq):
            for j in range(lk):
                q, k = int(qp[r, i]), int(kp[r, j])
                ok = (not causal or k <= q) and (qs is None or qs[r, i] == ks[r, j])
                ok = ok and (k_mask is None or bool(k_mask[r, j]))
                local = (window is None or q - k < window) and (
                    chunk_size is None or q // chunk_size == k // chunk_size)
                out[r, i, j] = ok and (local or k < sink_tokens)
    return out


def reference(q, k, v, mask, bias=None, sinks=None):
    """float64 attention with sinks: p = e^s / (e^sink + sum e^s); a row without keys is 0."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    s = np.where(mask[:, None], s, -np.inf)
    sink = (np.full((q.shape[2],), -np.inf) if sinks is None
            else np.asarray(sinks, np.float64))[None, :, None, None]
    m = np.maximum(np.max(s, axis=-1, keepdims=True), sink)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    denom = p.sum(-1, keepdims=True) + np.exp(sink - m)
    p = np.where(denom > 0, p / np.where(denom > 0, denom, 1.0), 0.0)
    p_sink = np.where(denom > 0, np.exp(sink - m) / np.where(denom > 0, denom, 1.0), 0.0)
    return np.einsum("bhqk,bkhd->bqhd", p, v), p_sink[..., 0]             # [B,Lq,H,D], [B,H,Lq]


def _inputs(length, seed=0):
    keys = jax.random.split(jax.random.key(seed), 5)
    q = jax.random.normal(keys[0], (B, length, H, D))
    k = jax.random.normal(keys[1], (B, length, K, D))
    v = jax.random.normal(keys[2], (B, length, K, D))
    cot = jax.random.normal(keys[3], (B, length, H, D))
    sinks = jax.random.normal(keys[4], (H,)) * 2.0
    return q, k, v, cot, sinks


def _packed(length):
    """Row 0: one document; row 1: documents at 0, 9 and 23 (positions restart)."""
    seg = np.zeros((B, length), np.int32)
    pos = np.tile(np.arange(length, dtype=np.int32), (B, 1))
    for i, s in enumerate((9, 23)):
        seg[1, s:], pos[1, s:] = i + 1, np.arange(length - s)
    return pos, seg


CASES = {  # name: (length, attend kwargs besides the inputs, with sinks?, packed?)
    "packed_window_sink_tokens": (37, {"window": 7, "sink_tokens": 2}, True, True),
    "chunks_odd_length": (37, {"chunk_size": 8}, True, False),
    "chunks_packed_no_sinks": (37, {"chunk_size": 8}, False, True),
    "chunk_longer_than_sequence": (21, {"chunk_size": 64}, True, False),
    "window_longer_than_sequence": (21, {"window": 100, "sink_tokens": 1}, True, False),
    "chunk_window_sink_tokens": (45, {"chunk_size": 16, "window": 5, "sink_tokens": 3}, True,
                                 True),
}


def _run(impl, q, k, v, sinks, pos, seg, k_mask=None, causal=True, **kw):
    enc = posenc_jax.get("alibi", num_heads=H)
    return attend(q, k, v, encoding=enc, params={}, q_positions=pos, k_positions=pos,
                  q_segment_ids=seg, k_segment_ids=seg, k_mask=k_mask, causal=causal,
                  implementation=impl, block_q=16, block_k=16, sinks=sinks, **kw)


def _out_and_grads(f, with_sinks=True):
    """jit of q, k, v, sinks, cot -> (f's output, grads of sum(f * cot) wrt q, k, v (and the
    sinks)): the values and the gradients in one compiled program a backend and case."""
    def loss(q, k, v, s, cot):
        out = f(q, k, v, s)
        return jnp.sum(out * cot), out
    grad = jax.grad(loss, argnums=(0, 1, 2, 3) if with_sinks else (0, 1, 2), has_aux=True)
    return jax.jit(lambda *a: grad(*a)[::-1])


@pytest.mark.parametrize("case", CASES)
def test_every_backend_equals_the_float64_reference_values_and_gradients(case):
    length, kw, with_sinks, packed = CASES[case]
    q, k, v, cot, sinks = _inputs(length)
    sinks = sinks if with_sinks else None
    pos, seg = _packed(length) if packed else (np.tile(np.arange(length), (B, 1)), None)
    mask = reference_mask(pos, pos, qs=seg, ks=seg, **kw)
    bias = posenc_jax.get("alibi", num_heads=H).bias({}, jnp.asarray(pos), jnp.asarray(pos))
    want, p_sink = reference(q, k, v, mask, bias, sinks)
    got = {}
    for impl in IMPLS:
        out, got[impl] = _out_and_grads(
            lambda q, k, v, s, impl=impl: _run(impl, q, k, v, s, pos, seg, **kw),
            with_sinks)(q, k, v, sinks, cot)
        np.testing.assert_allclose(out, want, atol=2e-5, err_msg=f"{case} {impl} values")
    for impl in IMPLS[1:]:
        for name, g, r in zip(("dq", "dk", "dv", "dsinks"), got[impl], got["dense"]):
            np.testing.assert_allclose(g, r, atol=1e-4 * max(1.0, float(jnp.abs(r).max())),
                                       err_msg=f"{case} {impl} {name}")
    if with_sinks:  # d sink_h = -sum_rows p_sink * rowsum(cot * out)
        closed = -np.einsum("bhq,bqh->h", p_sink, np.sum(np.asarray(cot, np.float64) * want, -1))
        np.testing.assert_allclose(got["dense"][3], closed, atol=1e-4)
        assert np.abs(closed).max() > 1e-2  # the sinks' gradient is not trivially zero
    if "chunk_size" in kw and kw["chunk_size"] < length or "window" in kw and kw["window"] < 37:
        plain = reference(q, k, v, reference_mask(pos, pos, qs=seg, ks=seg), bias, sinks)[0]
        assert np.abs(plain - want).max() > 1e-2  # the local rule changed the result


def test_a_row_that_sees_no_key_but_the_sink_gives_zeros_and_a_finite_gradient():
    """Row 1's keys all masked (an empty cache row) and bidirectional queries of a segment no
    key has: their whole mass is on the sink, the output 0, every gradient finite."""
    length = 21
    q, k, v, cot, sinks = _inputs(length, seed=3)
    pos = np.tile(np.arange(length), (B, 1))
    k_mask = np.ones((B, length), bool)
    k_mask[1] = False
    qs = np.zeros((B, length), np.int32)
    qs[0, 15:] = 7                                     # segment 7: no key carries it
    ks = np.zeros((B, length), np.int32)
    enc = posenc_jax.get("alibi", num_heads=H)
    for impl in IMPLS:
        def f(q, k, v, s, impl=impl):
            return attend(q, k, v, encoding=enc, params={}, q_positions=pos, k_positions=pos,
                          q_segment_ids=qs, k_segment_ids=ks, k_mask=k_mask, causal=False,
                          implementation=impl, block_q=16, block_k=16, sinks=s)
        out, grads = _out_and_grads(f)(q, k, v, sinks, cot)
        assert float(jnp.abs(out[1]).max()) == 0.0 and float(jnp.abs(out[0, 15:]).max()) == 0.0
        assert float(jnp.abs(out[0, :15]).max()) > 0.1
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads), impl


def test_transformers_goldens_gpt_oss_sinks_and_llama4_chunks():
    """Values and gradients against transformers' own attention functions (float64)."""
    data = np.load(GOLDEN)
    cases = {"gpt_oss_window": {"window": 6}, "gpt_oss_full": {},
             "llama4_chunked": {"chunk_size": 8}}
    enc = posenc_jax.get("nope")
    for name, kw in cases.items():
        g = {key.split("/")[1]: data[key] for key in data.files if key.startswith(name + "/")}
        q = jnp.asarray(g["q"].transpose(0, 2, 1, 3), jnp.float32)         # [B, L, H, D]
        k = jnp.asarray(g["k"].transpose(0, 2, 1, 3), jnp.float32)
        v = jnp.asarray(g["v"].transpose(0, 2, 1, 3), jnp.float32)
        sinks = jnp.asarray(g["sinks"], jnp.float32) if "sinks" in g else None
        real = g["k_mask"][:, :, None, None]                # the rows transformers computes
        for impl in IMPLS:
            def f(q, k, v, s, impl=impl, g=g, kw=kw):
                return attend(q, k, v, encoding=enc, params={}, q_positions=g["positions"],
                              k_positions=g["positions"], k_mask=g["k_mask"],
                              implementation=impl, block_q=16, block_k=16, sinks=s, **kw)
            out, grads = _out_and_grads(f, sinks is not None)(q, k, v, sinks, g["cot"])
            np.testing.assert_allclose(np.where(real, out, 0), np.where(real, g["out"], 0),
                                       atol=2e-5, err_msg=f"{name} {impl}")
            for n, got in zip(("dq", "dk", "dv", "dsinks"), grads):
                want = g[n] if n == "dsinks" else g[n].transpose(0, 2, 1, 3)
                np.testing.assert_allclose(got, want, atol=1e-4 * max(1.0, np.abs(want).max()),
                                           err_msg=f"{name} {impl} {n}")


@pytest.mark.parametrize("kw,error,text", [
    ({"chunk_size": -8}, ValueError, "chunk_size must be >= 1, got chunk_size=-8"),
    ({"chunk_size": 0}, ValueError, "chunk_size must be >= 1, got chunk_size=0"),
    ({"chunk_size": 2.5}, TypeError, "chunk_size must be an int, got chunk_size=2.5"),
    ({"sink_tokens": -1}, ValueError, "sink_tokens must be >= 0, got sink_tokens=-1"),
    ({"sinks": jnp.zeros((3,))}, ValueError,
     r"sinks must have shape \[H=4\] \(one logit per query head\), got shape \(3,\)"),
    ({"sinks": jnp.zeros((4,), jnp.int32)}, TypeError,
     r"sinks must be a float array of shape \[H=4\], got dtype int32"),
    ({"sinks": jnp.zeros((4,)), "implementation": "cudnn"}, ValueError,
     (r"attention='cudnn' does not support sinks \(learned sink logits\); use "
      r"attention='dense' or 'blockwise'")),
    ({"chunk_size": 8, "implementation": "cudnn"}, ValueError,
     "attention='cudnn' does not support chunk_size=8; use attention='dense' or 'blockwise'"),
    ({"window": 4, "sink_tokens": 2, "implementation": "cudnn"}, ValueError,
     "attention='cudnn' does not support window=4"),
])
def test_bad_settings_are_refused_naming_the_key(kw, error, text):
    x = jnp.zeros((1, 8, H, D))
    pos = jnp.arange(8)
    with pytest.raises(error, match=text):
        attend(x, x[:, :, :K], x[:, :, :K], encoding=posenc_jax.get("nope"), q_positions=pos,
               k_positions=pos, **{"implementation": "dense", **kw})


def test_records_say_what_they_support_and_auto_never_picks_one_that_cannot():
    shapes = backends.Shapes(batch=1, q_len=8192, k_len=8192, heads=H, kv_heads=K, head_dim=D)
    enc = posenc_jax.get("alibi", num_heads=H)
    for field, extra in (("sinks", {"sinks": True}), ("chunked", {"chunk_size": 8}),
                         ("sink_tokens", {"window": 4, "sink_tokens": 2})):
        asked = shapes._replace(**extra)
        for name in backends.names():
            record = backends.get(name)
            reason = record.supports(enc, shapes=asked)
            assert (reason is None) == bool(getattr(record, field)), (name, field, reason)
        for platform in backends.PLATFORMS:
            chosen = backends.choose(enc, causal=True, shapes=asked, platform=platform)
            assert getattr(chosen, field), (platform, field, chosen.name)
            step = backends.choose(enc, causal=True, shapes=asked, platform=platform, lse=True)
            assert step.call_lse is not None and getattr(step, field)
    assert not backends.get("cudnn").sinks and backends.get("pallas").sinks


@pytest.mark.parametrize("impl", IMPLS)
def test_cache_decoding_masks_reset_at_a_chunk_edge_and_keep_sink_tokens_visible(impl):
    """The KV cache's mask path: one query at a time against S slots (filled in a shuffled
    order, the rest empty: k_mask) equals that row of the full sequence's attention, with a
    chunk (a query at a chunk's first position sees only itself) and with a window plus sink
    tokens (positions 0 and 1 stay visible as the window slides past them)."""
    length, slots = 24, 32
    q, k, v, _, sinks = _inputs(length, seed=5)
    pos = jnp.arange(length)
    order = np.random.default_rng(0).permutation(slots)[:length]   # slot of each token
    enc = posenc_jax.get("alibi", num_heads=H)
    for kw in ({"chunk_size": 8}, {"window": 4, "sink_tokens": 2}):
        full = jax.jit(lambda q, k, v, kw=kw: attend(
            q, k, v, encoding=enc, params={}, q_positions=pos, k_positions=pos, sinks=sinks,
            **kw))(q, k, v)
        step = jax.jit(lambda q, ck, cv, qp, cpos, valid, kw=kw: attend(   # one compile for all t
            q, ck, cv, encoding=enc, params={}, q_positions=qp, k_positions=cpos, k_mask=valid,
            implementation=impl, block_q=16, block_k=16, sinks=sinks, **kw))
        for t in (7, 8, 9, 17, 23):
            filled = order[:t + 1]                                   # tokens 0..t are cached
            ck, cv = np.zeros((2, B, slots, K, D), np.float32)
            ck[:, filled], cv[:, filled] = k[:, :t + 1], v[:, :t + 1]
            cpos = np.zeros((slots,), np.int32)
            cpos[filled] = np.arange(t + 1)
            valid = np.zeros((slots,), bool)
            valid[filled] = True
            got = step(q[:, t:t + 1], ck, cv, pos[t:t + 1], cpos, valid)
            np.testing.assert_allclose(got[:, 0], full[:, t], atol=2e-5, err_msg=f"{kw} {t}")
    only_self = reference(q[:, 8:9], k[:, 8:9], v[:, 8:9], np.ones((B, 1, 1), bool),
                          sinks=sinks)[0]
    chunked = jax.jit(lambda q, k, v: attend(q, k, v, encoding=posenc_jax.get("nope"),
                                             q_positions=pos, k_positions=pos, sinks=sinks,
                                             chunk_size=8))
    np.testing.assert_allclose(chunked(q, k, v)[:, 8:9], only_self, atol=2e-5)
