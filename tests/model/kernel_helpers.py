"""What the kernel tests share (test_pallas.py, test_kernel_*.py): test data drawn with NumPy,
and a function's output and gradients from ONE compiled program.

Why: the Pallas kernel runs in interpret mode on CPU, and a call outside `jax.jit` compiles
every operation and every interpreted kernel on its own (100-200 XLA compiles a test, each
shape again); `jax.random` compiles a sampler per shape. One `jax.jit` around the forward and
its vjp is one compile per path, and one the persistent cache can serve to the next process.
"""


import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc_jax.model.transformer import Transformer

# The suite compiles with XLA:CPU's cheap pipeline (tests/conftest.py, CHEAP_COMPILE): an
# interpreted kernel's program compiles ~4x faster there (FIRE's value-and-gradient program:
# 5.0 -> 1.2 CPU s). Both sides of every comparison are compiled alike.
jit = jax.jit


def normal(seed, *shapes, dtype=jnp.float32):
    """Standard normal arrays of the given shapes from one NumPy generator (no compile)."""
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(s, np.float32)).astype(dtype) for s in shapes)


def out_and_grads(f):
    """jit of (cot, *a) -> (f(*a), the gradients of sum(f(*a) * cot) w.r.t. every a) through
    one `jax.vjp`: the forward is traced once (no separate primal forward kernel)."""

    def run(cot, *a):
        out, vjp = jax.vjp(f, *a)
        return out, vjp(jnp.broadcast_to(cot, out.shape).astype(out.dtype))

    return jit(run)


def assert_close(got, want, atol=2e-5, gtol=1e-4):
    """(out, grads) against the reference's: `atol` on the output, `gtol` relative to the
    largest reference gradient (at least 1) on each gradient, every gradient finite."""
    (out, grads), (ref, refs) = got, want
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32),
                               atol=atol, rtol=0)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(refs), strict=True):
        g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, r, atol=gtol * max(1.0, float(np.abs(r).max())), rtol=0)


def numpy_model(cfg, seed=0):
    """A Transformer of `cfg` with NumPy-drawn parameters (N(0, 1 / fan_in) for matrices, ones
    for norm scales): created eagerly, the model would compile one sampler per shape."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def draw(x):
        if len(x.shape) == 1:
            return jnp.asarray(np.ones(x.shape, x.dtype))
        fan_in = int(np.prod(x.shape[:-1]))
        return jnp.asarray((rng.standard_normal(x.shape) / np.sqrt(fan_in)).astype(x.dtype))

    return nnx.merge(graphdef, jax.tree.map(draw, state))
