"""The attention-backend registry (`posenc_jax.model.backends`) and the rotation rule
(`posenc_jax.model.rotation`): one record per backend decides what runs where; "auto",
the config and the study ask the records; a new backend is one record."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc_jax
from posenc_jax.model import backends, rotation
from posenc_jax.model.attention import IMPLEMENTATIONS, attend
from posenc_jax.model.backends import registry
from posenc_jax.model.config import TransformerConfig

B, L, H, D = 1, 8, 2, 8
SMALL = backends.Shapes(batch=B, q_len=L, k_len=L, heads=H, kv_heads=H, head_dim=D)
LONG = SMALL._replace(q_len=4096, k_len=4096)
MID = SMALL._replace(q_len=512, k_len=512)  # dense on accelerators, blockwise on CPU


def _enc(name):
    return posenc_jax.for_model(name, embed_dim=H * D, num_heads=H, head_dim=D)


def test_every_name_comes_from_the_registry():
    assert backends.names() == ("dense", "blockwise", "pallas", "cudnn")
    assert IMPLEMENTATIONS == (*backends.names(), "auto")
    with pytest.raises(ValueError, match=r"unknown attention implementation 'flash'; valid "
                                         r"implementations are: 'dense', 'blockwise', 'pallas', "
                                         r"'cudnn', 'auto'"):
        backends.get("flash")


@pytest.mark.parametrize("name,backend,want", [
    ("alibi", "pallas", None), ("rope", "pallas", None), ("t5", "cudnn", None),
    ("shaw", "pallas", ("'shaw' has a score bias that reads the query (a QueryBias), which "
                        "attention='pallas' does not compute")),
    ("cope", "blockwise", ("'cope' reads whole rows of attention logits (a RowBias), which "
                           "attention='blockwise' does not compute; use attention='dense'")),
    ("cope", "pallas", "reads whole rows"), ("cope", "cudnn", "use attention='dense'"),
    ("xpos", "cudnn", ("'xpos' declares a block transform, which attention='cudnn' does not "
                       "apply; use attention='dense' or 'blockwise'")),
])
def test_supports_gives_none_or_the_reason(name, backend, want):
    reason = backends.get(backend).supports(_enc(name), shapes=SMALL)
    assert reason is None if want is None else want in reason


def test_causal_only_platforms_and_gqa_are_reasons_too():
    assert "causal attention only" in backends.get("dense").supports(_enc("xpos"), causal=False)
    assert "does not lower for platform 'cpu'" in backends.get("cudnn").supports(
        _enc("rope"), platform="cpu")
    assert backends.get("pallas").supports(_enc("rope"), platform="tpu") is None


@pytest.mark.parametrize("name,platform,shapes,want", [
    ("alibi", "cuda", SMALL, "pallas"), ("alibi", "tpu", LONG, "pallas"),
    ("alibi", "cpu", SMALL, "dense"), ("alibi", "cpu", LONG, "blockwise"),
    ("alibi", "rocm", LONG, "blockwise"), ("shaw", "cuda", SMALL, "dense"),
    ("shaw", "cuda", LONG, "blockwise"), ("cope", "cpu", LONG, "dense"),
    ("cope", "cuda", LONG, "dense"), ("alibi", "cpu", MID, "blockwise"),
    ("shaw", "cuda", MID, "dense"), ("cope", "cpu", MID, "dense"),
])
def test_auto_chooses_from_the_records(name, platform, shapes, want):
    assert backends.choose(_enc(name), causal=True, shapes=shapes, platform=platform).name == want


def test_auto_lowers_the_kernel_for_gpu_and_portable_paths_for_cpu():
    enc = _enc("alibi")
    q = jnp.ones((B, L, H, D))
    f = jax.jit(lambda q: attend(q, q, q, encoding=enc, params={}, q_positions=jnp.arange(L),
                                 k_positions=jnp.arange(L), implementation="auto"))
    chex.assert_trees_all_close(f(q), attend(q, q, q, encoding=enc, params={},
                                             q_positions=jnp.arange(L),
                                             k_positions=jnp.arange(L)))
    text = f.trace(q).lower(lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in text and "posenc_flash_fwd_kernel" in text


def test_a_new_backend_is_one_record():
    """A user's backend: registered, listed, validated by the config, chosen by nobody
    unless asked, called through attend with the same inputs as every other."""
    calls = []

    def call(x: backends.Inputs):
        calls.append(x.rotation)
        return backends.get("dense").call(x)

    rec = backends.register(backends.Backend(
        name="test_mine", call=call, bias=frozenset({"elementwise"}),
        platforms=frozenset(backends.PLATFORMS)))
    try:
        assert "test_mine" in backends.names()
        kw = {"vocab_size": 8, "num_layers": 1, "embed_dim": H * D, "num_heads": H,
              "mlp_dim": 8, "attention": "test_mine"}
        assert TransformerConfig(**kw, encoding="alibi").attention == "test_mine"
        with pytest.raises(ValueError, match=r"'shaw' has a score bias that reads the query"):
            TransformerConfig(**kw, encoding="shaw")
        q = jnp.asarray(np.random.default_rng(0).standard_normal((B, L, H, D)), jnp.float32)
        pos = jnp.arange(L)
        got = attend(q, q, q, encoding=_enc("alibi"), q_positions=pos, k_positions=pos,
                     implementation="test_mine")
        chex.assert_trees_all_close(got, attend(q, q, q, encoding=_enc("alibi"),
                                                q_positions=pos, k_positions=pos))
        assert calls == [None]
        with pytest.raises(ValueError, match="'test_mine' is already taken"):
            backends.register(rec)
    finally:
        registry._REGISTRY.pop("test_mine")


def test_the_legacy_dense_backend_is_gone():
    """Issue 29's leftover: `dense_backend=` selected cuDNN before the records did; the
    backend is named by `attention=` alone now."""
    kw = {"vocab_size": 8, "num_layers": 1, "embed_dim": H * D, "num_heads": H, "mlp_dim": 8}
    assert TransformerConfig(**kw, attention="cudnn").attention == "cudnn"
    with pytest.raises(TypeError, match="dense_backend"):
        TransformerConfig(**kw, dense_backend="cudnn")
    x = jnp.zeros((1, L, H, D))
    with pytest.raises(TypeError, match="dense_backend"):
        attend(x, x, x, encoding=_enc("nope"), q_positions=jnp.arange(L),
               k_positions=jnp.arange(L), dense_backend="cudnn")
    assert not hasattr(registry, "LEGACY_DENSE")
    assert {f.name for f in dataclasses.fields(backends.Backend)}.isdisjoint(
        {"summary", "segment_ids", "cache", "dense_backend"})


def test_the_rotation_rule():
    """Deferred (raw q, k and cache) exactly for a KernelRotary encoding with a backend that
    rotates inside, or "auto" where one may be chosen; the backend then gets the rotation."""
    rope, mrope, alibi = _enc("rope"), _enc("mrope"), _enc("alibi")
    assert rotation.rotates_inside(rope, "pallas") and rotation.rotates_inside(rope, "auto")
    assert not rotation.rotates_inside(rope, "dense")
    assert not rotation.rotates_inside(mrope, "pallas") and not rotation.rotates_inside(
        alibi, "pallas")
    q = jnp.asarray(np.random.default_rng(1).standard_normal((B, L, H, D)), jnp.float32)
    pos = jnp.arange(L)[None]
    qq, kk, rot = rotation.for_backend(backends.get("pallas"), rope, {}, q, q, pos, pos, None,
                                       rotated=False)
    assert qq is q and rot is not None and rot.layout == "half"
    qq, kk, rot = rotation.for_backend(backends.get("dense"), rope, {}, q, q, pos, pos, None,
                                       rotated=False)
    want_q, want_k = rope.rotate({}, q, q, pos, pos)
    assert rot is None
    chex.assert_trees_all_close((qq, kk), (want_q, want_k))
    dynamic = posenc_jax.get("rope", head_dim=D, max_position_embeddings=4,
                             scaling={"rope_type": "dynamic", "factor": 2.0})
    mask = jnp.arange(L)[None] < 5
    assert int(rotation.seq_len(dynamic, pos, mask)) == 5
    assert rotation.seq_len(rope, pos, mask) is None


def test_auto_on_a_gpu_host_asks_the_kernel_whether_it_lowers(monkeypatch):
    """FIRE's MLP does not lower under Triton (issues 23, 26): on a GPU host "auto" must not
    pick the kernel for it, and says why when asked; ALiBi still gets the kernel."""
    monkeypatch.setattr(backends.registry, "host_platform", lambda: "cuda")
    shapes = backends.Shapes(batch=1, q_len=256, k_len=256, heads=4, kv_heads=4, head_dim=64)
    fire = posenc_jax.get("fire", num_heads=4)
    assert backends.choose(fire, causal=True, shapes=shapes, platform="cuda").name != "pallas"
    reason = backends.get("pallas").supports(fire, shapes=shapes, platform="cuda")
    assert reason is not None and "attention='pallas'" in reason
    alibi = posenc_jax.get("alibi", num_heads=4)
    assert backends.choose(alibi, causal=True, shapes=shapes, platform="cuda").name == "pallas"
