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

What a program computes is unchanged (the same HLO; only how it becomes machine code), the
tests' tolerances are the same, and both settings are in the persistent cache's key (the
serialized compile options: debug options and `env_option_overrides`), so a cheap program and
an optimised one never share an entry. Everything is put back after the module. The fusion
setting goes in where JAX builds each program's compile options (`compiler_options` of
`jax.jit` reach XLA the same way; an explicit one in a test wins); if a JAX release moves
that function, only the O0 flag applies and the tests still run.
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
