"""Learned absolute table: exact rows, and out-of-range positions are loud (never a clamp)."""

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from jax.experimental import checkify

from posenc_jax.encodings import learned

MAX_LEN, DIM = 16, 8
TABLE = learned.init(jax.random.key(0), MAX_LEN, DIM)
_lookup = jax.jit(learned.lookup)
_checked = jax.jit(checkify.checkify(learned.checked_lookup))


def test_init_shape_dtype_and_scale():
    table = learned.init(jax.random.key(1), 512, 64, stddev=0.5, dtype=jnp.bfloat16)
    chex.assert_shape(table, (512, 64))
    chex.assert_type(table, jnp.bfloat16)
    assert 0.45 < float(jnp.std(table.astype(jnp.float32))) < 0.55


@given(positions=st.lists(st.integers(0, MAX_LEN - 1), min_size=6, max_size=6),
       batched=st.booleans())
def test_lookup_equals_table_rows(positions, batched):
    pos = np.asarray(positions, np.int32).reshape((2, 3) if batched else (6,))
    want = np.asarray(TABLE)[pos]
    for out in (learned.lookup(TABLE, pos), _lookup(TABLE, jnp.asarray(pos)),
                learned.checked_lookup(TABLE, pos)):
        chex.assert_shape(out, pos.shape + (DIM,))
        chex.assert_type(out, TABLE.dtype)
        np.testing.assert_array_equal(np.asarray(out), want)
    err, out = _checked(TABLE, jnp.asarray(pos))
    assert err.get() is None
    np.testing.assert_array_equal(np.asarray(out), want)


def test_lookup_keeps_table_dtype_and_vmaps_and_grads():
    table = TABLE.astype(jnp.bfloat16)
    chex.assert_type(_lookup(table, jnp.arange(3)), jnp.bfloat16)
    pos = jnp.array([[0, 1], [2, 3]])
    chex.assert_trees_all_equal(jax.vmap(learned.lookup, in_axes=(None, 0))(TABLE, pos),
                                _lookup(TABLE, pos))
    g = jax.grad(lambda t: learned.lookup(t, jnp.array([2, 2, 5])).sum())(TABLE)
    np.testing.assert_array_equal(np.asarray(g[:, 0]),
                                  np.bincount([2, 2, 5], minlength=MAX_LEN).astype(np.float32))


@pytest.mark.parametrize("bad, index", [(16, "1, 0"), (-1, "1, 0"), (1000, "1, 0")])
def test_concrete_out_of_range_raises_naming_position_and_value(bad, index):
    pos = np.array([[0, 1, 2], [bad, 4, 99]])
    msg = rf"positions\[{index}\]={bad}, allowed range is \[0, 16\)"
    with pytest.raises(ValueError, match=msg):
        learned.lookup(TABLE, pos)
    with pytest.raises(ValueError, match=msg):
        learned.lookup(TABLE, jnp.asarray(pos))  # concrete jax array: checked on the host
    with pytest.raises(ValueError, match=msg):
        learned.checked_lookup(TABLE, pos)


def test_traced_out_of_range_is_nan_not_a_clamp():
    out = np.asarray(_lookup(TABLE, jnp.array([0, 15, 16, -1, 1 << 20, 3])))
    np.testing.assert_array_equal(out[[0, 1, 5]], np.asarray(TABLE)[[0, 15, 3]])
    assert np.isnan(out[2:5]).all()  # not row 15 (clamp) nor row 15 (negative wrap)


def test_checkify_reports_the_first_bad_traced_position():
    err, out = _checked(TABLE, jnp.array([[0, 1, 2], [3, 17, 40]]))
    assert err.get() is not None
    assert "positions[1, 1]=17, allowed range is [0, 16)" in err.get()
    with pytest.raises(Exception, match=r"positions\[1, 1\]=17"):
        err.throw()
    err, _ = _checked(TABLE, jnp.array([-3, 0]))
    assert "positions[0]=-3" in err.get()
    assert np.isnan(np.asarray(out[1, 1])).all()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_float_positions_are_a_type_error(dtype):
    with pytest.raises(TypeError, match=f"integer dtype .*got dtype={jnp.dtype(dtype).name}"):
        learned.lookup(TABLE, jnp.arange(3, dtype=dtype))
    with pytest.raises(TypeError, match="got dtype=float32"):
        jax.jit(learned.checked_lookup)(TABLE, jnp.arange(3.0))


@pytest.mark.parametrize("max_len, dim, name, value", [(0, 4, "max_len", 0),
                                                       (4, 0, "dim", 0),
                                                       (-2, 4, "max_len", -2)])
def test_bad_init_sizes(max_len, dim, name, value):
    with pytest.raises(ValueError, match=f"{name} must be >= 1, got {name}={value}"):
        learned.init(jax.random.key(0), max_len, dim)


def test_bad_table():
    with pytest.raises(ValueError, match=r"2-D \[max_len, E\], got shape \(4,\)"):
        learned.lookup(jnp.zeros(4), jnp.arange(2))
