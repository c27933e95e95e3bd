"""The mixed-precision policy (docs/performance.md), read off the traced program.

`TransformerConfig(dtype="bfloat16", param_dtype="float32")`: parameters (and so gradients
and optimizer moments) are float32; every forward matmul takes bfloat16 operands; the
attention scores, the logits and the loss are float32, and so is every softmax (`exp`,
`log`, `reduce_max`) and every RMSNorm statistic (`rsqrt`) -- forward and backward, in the
dense and the blockwise attention.
"""

import collections

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.extend import core as jcore

from posenc_jax.model.transformer import Transformer, TransformerConfig

MIXED = {"dtype": "bfloat16", "param_dtype": "float32"}
F32, BF16 = jnp.dtype("float32"), jnp.dtype("bfloat16")


def _eqns(jaxpr):
    """Every equation of a jaxpr and of the jaxprs nested in it (scan, cond, remat, pjit)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                if isinstance(sub, jcore.ClosedJaxpr):
                    yield from _eqns(sub.jaxpr)
                elif isinstance(sub, jcore.Jaxpr):
                    yield from _eqns(sub)


def _ops(closed) -> collections.Counter:
    """(primitive, input dtypes, output dtype) -> count, for the ops the policy is about."""
    out = collections.Counter()
    for e in _eqns(closed.jaxpr):
        if e.primitive.name in ("dot_general", "exp", "log", "reduce_max", "rsqrt"):
            ins = tuple(jnp.dtype(v.aval.dtype) for v in e.invars)
            out[(e.primitive.name, ins, jnp.dtype(e.outvars[0].aval.dtype))] += 1
    return out


def _model(attention):
    cfg = TransformerConfig(vocab_size=40, num_layers=2, embed_dim=32, num_heads=4,
                            mlp_dim=48, encoding="alibi", attention=attention, block_size=4,
                            **MIXED)
    return Transformer(cfg, rngs=nnx.Rngs(0))


def _loss(graphdef, params, tokens):
    logits = nnx.merge(graphdef, params)(tokens)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits


@pytest.mark.parametrize("attention", ["dense", "blockwise"])
def test_mixed_precision_policy(attention):
    graphdef, params = nnx.split(_model(attention), nnx.Param)
    assert {x.dtype for x in jax.tree.leaves(params)} == {F32}
    tokens = jnp.zeros((2, 8), jnp.int32)

    forward = jax.make_jaxpr(lambda p: _loss(graphdef, p, tokens))(params)
    loss_aval, logits_aval = forward.out_avals
    assert loss_aval.dtype == F32 and logits_aval.dtype == F32
    fwd = _ops(forward)
    dots = [k for k in fwd if k[0] == "dot_general"]
    assert dots and all(ins == (BF16, BF16) for _, ins, _ in dots), dots
    assert any(out == F32 for _, _, out in dots)  # scores and logits accumulate in float32

    grad_fn = jax.value_and_grad(lambda p: _loss(graphdef, p, tokens), has_aux=True)
    both = jax.make_jaxpr(grad_fn)(params)
    ops = _ops(both)
    for name in ("exp", "log", "reduce_max", "rsqrt"):
        kinds = [k for k in ops if k[0] == name]
        assert kinds and all(k[1] == (F32,) and k[2] == F32 for k in kinds), (name, kinds)
    grads = both.out_avals[2:]
    assert grads and {a.dtype for a in grads} == {F32}


def test_mixed_precision_logits_track_float32():
    """The bfloat16 compute changes the logits by bfloat16 rounding, not more."""
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 40)
    cfg = {"vocab_size": 40, "num_layers": 2, "embed_dim": 32, "num_heads": 4, "mlp_dim": 48}
    forward = jax.jit(lambda m, t: m(t))  # one program a model, not op by op
    full = forward(Transformer(TransformerConfig(**cfg), rngs=nnx.Rngs(0)), tokens)
    mixed = forward(Transformer(TransformerConfig(**cfg, **MIXED), rngs=nnx.Rngs(0)), tokens)
    assert mixed.dtype == F32
    err = jnp.max(jnp.abs(mixed - full)) / jnp.max(jnp.abs(full))
    assert 0 < err < 0.05, err
