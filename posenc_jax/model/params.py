"""How the model's modules create parameters: logical axis names, sharded at creation.

`param(value, names, dtype)` wraps an array as an `nnx.Param` whose `out_sharding` metadata
is its logical axis names (see `posenc_jax.model.transformer` for the names); it is placed on
the mesh at creation only when a mesh and logical axis rules are both set. `normal(key,
shape, fan_in)` is the N(0, 1 / fan_in) initialiser every projection uses.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import meta as flax_meta
from flax.core import spmd as flax_spmd

__all__ = ["normal", "param"]

Array = jax.Array


def _eager_sharding() -> bool:
    return flax_meta.get_global_mesh() is not None and bool(flax_spmd.get_logical_axis_rules())


def param(value: Array, names: tuple, dtype) -> nnx.Param:
    """`value` cast to `dtype` as an `nnx.Param` with logical axis `names`."""
    return nnx.Param(value.astype(dtype), out_sharding=names, eager_sharding=_eager_sharding())


def normal(key, shape, fan_in: int) -> Array:
    """N(0, 1 / fan_in) in float32."""
    return jax.random.normal(key, shape, jnp.float32) / math.sqrt(fan_in)
