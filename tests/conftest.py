"""Strict mode for every test: 8 fake CPU devices and no implicit rank promotion.

The device count must be set before JAX initialises its backends, so it is done here at
import time, before any test module imports jax.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import hypothesis
import jax
import pytest

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


def pytest_collection_modifyitems(config, items):
    """Tests marked `full` (the exhaustive cases past what CI's 12 minutes hold; each file
    says which cover the suite keeps) run only with POSENC_TEST_FULL=1."""
    if os.environ.get("POSENC_TEST_FULL") == "1":
        return
    skip = pytest.mark.skip(reason="exhaustive case: POSENC_TEST_FULL=1 runs it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)
