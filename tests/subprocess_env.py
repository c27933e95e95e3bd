"""What a test's process inherits of the suite's compile settings when the test gives it
XLA_FLAGS of its own (tests/conftest.py, CHEAP_COMPILE)."""

import os


def cheap_xla_flags() -> dict[str, str]:
    """{"XLA_FLAGS": the suite's cheap-compile flag} while it is on (not in a test marked
    `optimized_compile`, not with POSENC_TEST_CHEAP_COMPILE=0), else {}: for a process started
    without the suite's XLA_FLAGS (its 8 fake devices), e.g. a benchmark's smoke."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if f.startswith("--xla_cpu_use_fusion_emitters")]
    return {"XLA_FLAGS": " ".join(flags)} if flags else {}
