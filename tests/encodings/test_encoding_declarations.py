"""What an encoding declares is all the model needs: params' logical axes, model defaults, the
hooks it uses. A user's own encoding with a table is sharded by its declared axes on the
8-device mesh, and the model creates exactly the params that the hooks it calls read."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import posenc_jax
from posenc_jax.encodings import base, capabilities
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.transformer import Transformer, complete_rules, encoding_params

NAME = "user_distance_table"


@pytest.fixture
def user_encoding():
    """A user's scheme, registered for the test and removed after it."""

    @dataclasses.dataclass(frozen=True)
    class DistanceTable(base.Encoding, capabilities.ParamAxes, capabilities.ModelDefaults):
        """A learned bias per head for each clipped distance |i - j| < max_distance."""

        hooks: ClassVar = frozenset({"bias"})
        param_axes: ClassVar = {"table": ("table", "heads")}
        model_defaults: ClassVar = {"max_distance": 16}

        num_heads: int
        max_distance: int = 4

        def init(self, key):
            return {"table": jax.random.normal(key, (self.max_distance, self.num_heads))}

        def bias(self, params, q_positions, k_positions, *, q=None):
            q, k = jnp.asarray(q_positions)[..., :, None], jnp.asarray(k_positions)[..., None, :]
            d = jnp.minimum(jnp.abs(k - q), self.max_distance - 1)
            return jnp.moveaxis(params["table"][d], -1, -3)            # [..., H, Lq, Lk]

    cls = base.register(NAME)(DistanceTable)
    yield cls
    del base._REGISTRY[NAME]


def tiny(encoding, **kw):
    return TransformerConfig(vocab_size=32, num_layers=2, embed_dim=32, num_heads=4, mlp_dim=64,
                             encoding=encoding, **kw)


def test_model_defaults_apply_in_a_model_not_in_get(user_encoding):
    assert posenc_jax.get(NAME, num_heads=4).max_distance == 4
    assert tiny(NAME).layer_encoding(0).max_distance == 16
    assert tiny(NAME, encoding_kwargs={"max_distance": 8}).layer_encoding(0).max_distance == 8
    assert tiny("learned").input_encoding.stddev == 1.0      # declared by the learned scheme


def test_user_table_is_sharded_by_its_declared_axes(user_encoding):
    cfg = tiny(NAME)
    rules = complete_rules((("batch", "data"), ("table", "data"), ("heads", "tensor"),
                            ("embed", "fsdp")))
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
    tokens = jax.random.randint(jax.random.key(1), (4, 12), 0, 32)
    forward = jax.jit(lambda m, t: m(t))  # one program, not op by op
    reference = forward(Transformer(cfg, rngs=nnx.Rngs(0)), tokens)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        table = model.layers[0].attn.pe["table"]
        specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
        assert specs["layers"][0]["attn"]["pe"]["table"].get_value() == P("data", "tensor")
        assert table[...].sharding.spec == P("data", "tensor")
        assert len(table[...].sharding.device_set) == 8
        logits = forward(model, tokens)
    chex.assert_trees_all_close(np.asarray(logits), np.asarray(reference), atol=2e-5, rtol=2e-5)


def _param_paths(model) -> set[str]:
    state = nnx.state(model, nnx.Param)
    return {"/".join(map(str, path)) for path, _ in nnx.to_flat_state(state)}


@pytest.mark.parametrize("encoding, input_table, layer_tables", [
    ("learned", True, False),   # embed hook only: one table at the input, none per layer
    ("t5", False, True),        # bias hook only: one table per layer, none at the input
    ("shaw", False, True),
    ("rope", False, False),
    ("alibi", False, False),
    ("nope", False, False),
])
def test_model_creates_only_the_params_its_hooks_read(encoding, input_table, layer_tables):
    paths = _param_paths(Transformer(tiny(encoding), rngs=nnx.Rngs(0)))
    assert any(p.startswith("input_pe/") for p in paths) == input_table
    per_layer = [p for p in paths if "/attn/pe/" in p]
    assert len(per_layer) == (2 if layer_tables else 0), per_layer


def test_param_axes_must_match_the_param_rank(user_encoding):
    class Wrong(user_encoding):
        param_axes: ClassVar = {"table": ("table",)}

    with pytest.raises(ValueError, match=r"declares param_axes\['table'\]=\('table',\) for a "
                                         r"param of shape \(4, 4\)"):
        encoding_params(Wrong(num_heads=4), jax.random.key(0), jnp.float32, hooks=("bias",))


def test_bias_from_elementwise_matches_a_direct_bias():
    enc = posenc_jax.get("alibi", num_heads=4)

    @dataclasses.dataclass(frozen=True)
    class Elementwise(base.Encoding, capabilities.ElementwiseBias):
        hooks: ClassVar = frozenset({"bias"})

        def elementwise_bias(self, params, q_positions, k_positions, head):
            slopes = jnp.asarray(posenc_jax.alibi.slopes(4))
            return -slopes[head] * jnp.abs(k_positions - q_positions).astype(jnp.float32)

    e = Elementwise()
    assert isinstance(e, capabilities.ElementwiseBias)
    assert not isinstance(posenc_jax.get("nope"), capabilities.ElementwiseBias)
    q, k = jnp.arange(5), jnp.arange(7)
    want = enc.bias({}, q, k)
    got = base.bias_from_elementwise(e, {}, q, k, num_heads=4)
    chex.assert_shape(got, (4, 5, 7))
    chex.assert_trees_all_close(got, want, atol=0, rtol=0)
    got_b = base.bias_from_elementwise(e, {}, jnp.stack([q, q + 3]), k, num_heads=4)
    chex.assert_shape(got_b, (2, 4, 5, 7))
    chex.assert_trees_all_close(got_b[1], enc.bias({}, q + 3, k))


@pytest.mark.parametrize("name", [3, None, ("rope",)])
def test_a_name_that_is_not_a_str_is_a_type_error(name):
    with pytest.raises(TypeError, match=r"an encoding name must be a str, got .*; valid names "
                                        r"are: alibi, "):
        posenc_jax.get(name)


def test_a_missing_hyperparameter_is_named_with_the_encoding():
    """Before: the dataclass's own "RoPE.__init__() missing 1 required positional argument"."""
    with pytest.raises(TypeError, match=r"encoding 'rope' needs hyperparameter\(s\) "
                                        r"\['head_dim'\]; it takes: \['head_dim', "):
        posenc_jax.get("rope")
    with pytest.raises(TypeError, match=r"encoding 'alibi' needs hyperparameter\(s\) "
                                        r"\['num_heads'\]"):
        posenc_jax.get("alibi")


def test_model_positions_are_checked_where_they_enter():
    model = Transformer(tiny("rope"), rngs=nnx.Rngs(0))
    tokens = jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(TypeError, match="positions must have an integer dtype"):
        model(tokens, jnp.arange(4.0))
    with pytest.raises(ValueError, match="positions"):                 # would wrap to < 0
        model(tokens, np.arange(4, dtype=np.int64) + 3_000_000_000)


def test_capability_refusal_names_the_encoding_once():
    with pytest.raises(ValueError) as err:
        tiny("cope", attention="blockwise")
    assert str(err.value).count("encoding 'cope'") == 1, str(err.value)
