"""Shared fixtures of tests/model/.

`cheap_compile` (module scope, opt-in: a module says
`pytestmark = pytest.mark.usefixtures("cheap_compile")`): while the module's tests run, XLA:CPU
compiles with its cheap settings: JAX's `jax_disable_most_optimizations` (backend optimisation
level 0, LLVM's expensive passes off) and XLA's `xla_cpu_use_fusion_emitters=false` (the
older loop emitters, which compile much faster than the MLIR fusion emitters). These tests
compile many small programs and run each once or a few times, so compiling is most of their
time. Measured (issue 36, one program of tests/model/test_sinks_chunks.py per backend, CPU
seconds of XLA's compile, dense / blockwise / pallas): default 0.67 / 2.40 / 1.93; O0 alone
0.35 / 1.40 / 1.17; fusion emitters off alone 0.38 / 2.19 / 1.46; both 0.09 / 0.45 / 0.40.

The tests' tolerances are the same and every test still runs its checks; both settings are in
the persistent cache's key (the serialized compile options: debug options and
`env_option_overrides`), so a cheap program and an optimised one never share an entry.
Everything is put back after the module. The fusion setting goes in where JAX builds each
program's compile options (where `jax.jit`'s `compiler_options` go too; an explicit one in a
test wins); if a JAX release moves that function, only the O0 flag applies.

Not every program computes the same at O0: at `xla_backend_optimization_level=0` the blockwise
backward of a row that sees no key gives NaN gradients (dq, dk) where XLA's default level 3
gives finite ones (found by this cut, issue 36: test_attention.py's blockwise gradient tests
fail at 0 and pass at 3). Such a program keeps the default with
`jax.jit(..., compiler_options={"xla_backend_optimization_level": 3})`, or its test with
`@pytest.mark.usefixtures("default_opt_level")` (the O0 flag off for that test; nnx.jit has no
compiler_options).
"""

import jax
import pytest
from jax._src import compiler

FLAG = "jax_disable_most_optimizations"
CHEAP = {"xla_cpu_use_fusion_emitters": False}


def _with_cheap_options(original):
    def get_compile_options(*args, env_options_overrides=None, **kwargs):
        overrides = {**CHEAP, **(env_options_overrides or {})}
        return original(*args, env_options_overrides=overrides, **kwargs)
    return get_compile_options


@pytest.fixture(scope="module")
def cheap_compile():
    before = jax.config.read(FLAG)
    jax.config.update(FLAG, True)
    with pytest.MonkeyPatch.context() as patch:
        original = getattr(compiler, "get_compile_options", None)
        if original is not None:
            patch.setattr(compiler, "get_compile_options", _with_cheap_options(original))
        try:
            yield
        finally:
            jax.config.update(FLAG, before)


@pytest.fixture
def default_opt_level(cheap_compile):
    """XLA's default optimisation level for one test of a cheap_compile module (the blockwise
    gradients: NaN at level 0, see above); the loop emitters stay."""
    jax.config.update(FLAG, False)
    try:
        yield
    finally:
        jax.config.update(FLAG, True)
