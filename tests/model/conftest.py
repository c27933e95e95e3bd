"""Shared fixtures of tests/model/.

The suite compiles with XLA:CPU's cheap settings (tests/conftest.py, CHEAP_COMPILE). Not every
program computes the same there: at `xla_backend_optimization_level=0` the blockwise backward
(a `lax.switch` over key blocks inside `jax.checkpoint`) gives NaN in a few entries of dq and
dk where XLA's default level 3 gives finite ones, also op by op (eager, each primitive
compiled at O0), never without the switch or without the checkpoint, and never at level 3
(found by issue 36's cut; XLA:CPU at O0 also treats float32 subnormals as zero: log(1e-45) is
-inf there, -103.97 at level 3). Such a program keeps the default with
`jax.jit(..., compiler_options={"xla_backend_optimization_level": 3})`, or its test with
`@pytest.mark.usefixtures("default_opt_level")` (nnx.jit has no compiler_options).
"""

import jax
import pytest

FLAG = "jax_disable_most_optimizations"


@pytest.fixture
def default_opt_level():
    """XLA's default optimisation level for one test (the blockwise gradients: NaN at level 0,
    see above); the loop emitters stay. JAX's in-memory caches do not key on the flag, so the
    test must compile its own programs."""
    before = jax.config.read(FLAG)
    jax.config.update(FLAG, False)
    try:
        yield
    finally:
        jax.config.update(FLAG, before)
