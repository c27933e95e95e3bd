"""The optional capabilities of `posenc_jax.encodings.capabilities`: each is checked with
isinstance by the consumer its docstring names, and a user's scheme gets the behaviour by
inheriting it (no method identity, no flag). The core `Encoding` is init + three hooks."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc_jax
from posenc_jax.encodings import base
from posenc_jax.encodings import capabilities as cap
from posenc_jax.model import linen, scores
from posenc_jax.model.attention import attend
from posenc_jax.model.config import TransformerConfig

B, L, H, D = 2, 6, 2, 8


def _qkv(seed=0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal((B, L, H, D)), jnp.float32) for _ in range(3))


POS = jnp.arange(L)


@pytest.fixture
def registered():
    """Registers classes under temporary names; removes those registered after the test."""
    names = []

    def add(name, cls):
        names.append(name)
        return base.register(name)(dataclasses.dataclass(frozen=True)(cls))

    yield add
    for name in names:
        base._REGISTRY.pop(name, None)


def test_the_core_is_init_three_hooks_name_and_hooks():
    members = sorted(k for k in vars(base.Encoding) if not k.startswith("__"))
    assert members == ["bias", "embed", "hooks", "init", "name", "rotate"]


def test_register_refuses_a_capability_without_the_hook_it_refines(registered):
    class NoHook(base.Encoding, cap.ElementwiseBias):
        def elementwise_bias(self, params, q_positions, k_positions, head):
            return jnp.zeros(())

    with pytest.raises(ValueError, match=r"NoHook is a ElementwiseBias, which refines the 'bias' "
                                         r"hook, but declares hooks=\[\]"):
        registered("test_nohook", NoHook)
    with pytest.raises(ValueError, match=r"declares hooks=\('bias',\); hooks must be a frozenset"):
        registered("test_tuple", type("T", (base.Encoding,), {"hooks": ("bias",)}))


def test_a_missing_member_is_an_error_at_construction_or_registration(registered):
    class Half(base.Encoding, cap.ValueTerm):
        hooks: ClassVar = frozenset({"bias"})

    with pytest.raises(TypeError, match="value_term"):
        registered("test_half", Half)()

    class Axes(base.Encoding, cap.ParamAxes):
        hooks: ClassVar = frozenset({"bias"})

    with pytest.raises(TypeError, match="Axes is a ParamAxes but does not set param_axes"):
        registered("test_axes", Axes)


def test_elementwise_bias_a_new_scheme_runs_in_the_kernel_and_matches_dense(registered):
    """Consumer: the Pallas kernel. A new bias the kernel runs is one class."""

    class Linear(base.Encoding, cap.ElementwiseBias):
        hooks: ClassVar = frozenset({"bias"})
        num_heads: int = H

        def elementwise_bias(self, params, q_positions, k_positions, head):
            dist = jnp.abs(q_positions - k_positions).astype(jnp.float32)
            return -0.25 * (head.astype(jnp.float32) + 1.0) * dist

        def bias(self, params, q_positions, k_positions, *, q=None):
            return cap.bias_from_elementwise(self, params, q_positions, k_positions,
                                             num_heads=self.num_heads)

    enc = registered("test_linear", Linear)()
    q, k, v = _qkv()
    run = jax.jit(lambda impl: attend(q, k, v, encoding=enc, params={}, q_positions=POS,
                                      k_positions=POS, implementation=impl), static_argnums=0)
    chex.assert_trees_all_close(run("pallas"), run("dense"), atol=2e-5)


def test_kernel_rotary_and_length_dependent_are_ropes_not_mropes():
    """Consumers: the rotation rule and kv_cache; mrope shares RoPE's body without them."""
    rope = posenc_jax.get("rope", head_dim=D)
    mrope = posenc_jax.get("mrope", head_dim=D)
    dynamic = posenc_jax.get("rope", head_dim=D, scaling={"rope_type": "dynamic", "factor": 2.0},
                             max_position_embeddings=16)
    assert isinstance(rope, cap.KernelRotary) and not isinstance(mrope, cap.KernelRotary)
    assert not cap.is_length_dependent(rope) and not cap.is_length_dependent(mrope)
    assert cap.is_length_dependent(dynamic)
    assert int(dynamic.regime(jnp.arange(32))) != int(dynamic.regime(jnp.arange(8)))
    assert not cap.is_length_dependent(posenc_jax.get("alibi", num_heads=H))


def test_value_and_block_transform_enter_dense_and_blockwise_alike(registered):
    """Consumers: explicit.py and blockwise.py (ValueTerm), dense and blockwise
    (BlockTransform)."""

    class Extra(base.Encoding, cap.ValueTerm, cap.BlockTransform):
        hooks: ClassVar = frozenset({"bias", "rotate"})

        def value_term(self, params, weights, q_positions, k_positions):
            return jnp.broadcast_to(jnp.sum(weights, axis=-1, keepdims=True), (*weights.shape[:3], D))

        def block_transform(self, params, q, k, q_positions, k_positions):
            return q * 2.0, k

    enc = registered("test_extra", Extra)()
    q, k, v = _qkv(1)
    plain = posenc_jax.get("nope")
    kw = {"q_positions": POS, "k_positions": POS}
    want = jax.jit(lambda q, k, v: attend(q * 2.0, k, v, encoding=plain, **kw))(q, k, v) + 1.0
    for impl in ("dense", "blockwise"):  # the weights sum to 1 (want's + 1); one program each
        got = jax.jit(lambda q, k, v, i=impl: attend(q, k, v, encoding=enc, implementation=i,
                                                      block_q=4, block_k=4, **kw))(q, k, v)
        chex.assert_trees_all_close(got, want, atol=1e-5)


def test_causal_only_refuses_bidirectional_attention(registered):
    """Consumer: the attention backends' checks."""

    class OneWay(base.Encoding, cap.CausalOnly):
        hooks: ClassVar = frozenset({"rotate"})

    enc = registered("test_oneway", OneWay)()
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"'test_oneway' is defined for causal attention only"):
        attend(q, k, v, encoding=enc, q_positions=POS, k_positions=POS, causal=False)


def test_query_bias_receives_the_scaled_query(registered):
    """Consumer: scores.encoding_bias (and linen.ScoreBias, which then requires q)."""

    class Dot(base.Encoding, cap.QueryBias):
        hooks: ClassVar = frozenset({"bias"})

        def bias(self, params, q_positions, k_positions, *, q=None):
            return jnp.broadcast_to(jnp.sum(q, -1).transpose(0, 2, 1)[..., None],
                                    (*q.shape[:1], q.shape[2], q.shape[1], len(k_positions)))

    enc = registered("test_dot", Dot)()
    q, _, _ = _qkv()
    got = scores.encoding_bias(enc, {}, POS, POS, q, H)
    chex.assert_trees_all_close(got[:, :, :, 0], jnp.sum(q, -1).transpose(0, 2, 1))
    with pytest.raises(ValueError, match=r"'test_dot' reads the query: call ScoreBias"):
        linen.ScoreBias("test_dot").init(jax.random.key(0), POS, POS)


def test_row_bias_is_dense_only_and_works_through_linen():
    """Consumers: explicit.py through scores.encoding_bias; linen.ScoreBias with logits."""
    enc = posenc_jax.get("cope", head_dim=D)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"'cope' reads whole rows of attention logits \(a "
                                         r"RowBias\).*use attention='dense'"):
        attend(q, k, v, encoding=enc, params=enc.init(jax.random.key(0)), q_positions=POS,
               k_positions=POS, implementation="blockwise")
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D)
    module = linen.ScoreBias("cope", {"head_dim": D})
    params = module.init(jax.random.key(0), POS, POS, q=q, logits=logits)
    got = module.apply(params, POS, POS, q=q, logits=logits)
    want = enc.row_bias(params["params"]["pe"], POS, POS, q=q, logits=logits)
    chex.assert_shape(got, (B, H, L, L))
    chex.assert_trees_all_close(got, want)
    with pytest.raises(ValueError, match=r"'cope' reads the query and whole rows of logits"):
        module.init(jax.random.key(0), POS, POS, q=q)
    with pytest.raises(ValueError, match=r"call row_bias"):
        enc.bias({}, POS, POS, q=q)


def test_positions_tables_and_defaults_reach_the_config():
    """Consumers: TransformerConfig (position_axes, max_positions) and for_model."""
    kw = {"vocab_size": 8, "num_layers": 1, "embed_dim": 16, "num_heads": 2, "mlp_dim": 8}
    assert TransformerConfig(**kw, encoding="mrope").position_axes == 3
    assert TransformerConfig(**kw, encoding="rope").position_axes == 1
    learned = TransformerConfig(**kw, encoding="learned", encoding_kwargs={"max_len": 12})
    assert learned.max_positions == 12 and learned.input_encoding.stddev == 1.0
    assert TransformerConfig(**kw, encoding="alibi").max_positions is None
    assert cap.param_axes(posenc_jax.get("t5", num_heads=2)) == {"table": ("table", "heads")}
    assert cap.param_axes(posenc_jax.get("alibi", num_heads=2)) == {}
