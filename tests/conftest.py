"""Strict mode for every test: 8 fake CPU devices and no implicit rank promotion.

The device count must be set before JAX initialises its backends, so it is done here at
import time, before any test module imports jax.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

# XLA's CPU backend at LLVM optimisation level 0: the suite compiles thousands of small
# programs and runs each a few times, so compile time is most of its time (a 2-layer model's
# gradient: ~11 s to compile at the default level, ~3 s at 0; the same IEEE operations, only
# less optimised machine code). POSENC_TEST_XLA_OPT=1 keeps XLA's default level.
if (os.environ.get("POSENC_TEST_XLA_OPT", "0") != "1"
        and "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]):
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"

import hypothesis
import jax

jax.config.update("jax_numpy_rank_promotion", "raise")

hypothesis.settings.register_profile(
    "default", max_examples=25, deadline=None, print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.register_profile(
    "thorough", max_examples=300, deadline=None, print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
