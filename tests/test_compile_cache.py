"""The persistent compilation cache that tests/conftest.py turns on for the suite can never make
a test pass that would fail without it: a hit is the executable XLA compiled from the same
program with the same options, so two programs that differ (in an op, a constant, a shape, a
compiler option or XLA_FLAGS) never share an entry, a second process reads each entry back
with the right answers, and an unreadable entry is compiled afresh, not run.

Each check runs a small script in fresh processes (a process reads the cache settings once,
when JAX starts) on its own cache folder under tmp_path, never the suite's."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Four programs that a cache keyed on anything less than the whole program and its options
# would confuse: x + 1 and x + 2 differ in one constant, the third in its shape, the fourth
# only in a compiler option. Prints the results and how many cache hits and misses it saw.
SCRIPT = """
import json, jax, jax.numpy as jnp
from jax._src import monitoring
seen = {"hits": 0, "misses": 0}
def listen(event, **kwargs):
    if event == "/jax/compilation_cache/cache_hits": seen["hits"] += 1
    if event == "/jax/compilation_cache/cache_misses": seen["misses"] += 1
monitoring.register_event_listener(listen)
x = jnp.arange(4.0)
out = {
    "plus1": jax.jit(lambda v: v + 1.0)(x).tolist(),
    "plus2": jax.jit(lambda v: v + 2.0)(x).tolist(),
    "plus1_len3": jax.jit(lambda v: v + 1.0)(x[:3] * 1.0).tolist(),
    "plus1_o0": jax.jit(lambda v: v + 1.0,
                        compiler_options={"xla_backend_optimization_level": 0})(x).tolist(),
}
print(json.dumps({"out": out, **seen, "dir": jax.config.jax_compilation_cache_dir}))
"""
WANT = {"plus1": [1.0, 2.0, 3.0, 4.0], "plus2": [2.0, 3.0, 4.0, 5.0],
        "plus1_len3": [1.0, 2.0, 3.0], "plus1_o0": [1.0, 2.0, 3.0, 4.0]}


def _run(cache_dir, *, xla_flags: str = "") -> dict:
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PLATFORMS="cpu",
               XLA_FLAGS=xla_flags, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, text=True,
                          capture_output=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"stderr": done.stderr}


def _entries(cache_dir) -> set[str]:
    """The cache's entries for SCRIPT's four jitted lambdas (jnp.arange and slicing add their
    own)."""
    return {p.name for p in pathlib.Path(cache_dir).iterdir() if p.name.startswith("jit__lambda")}


def test_the_suite_and_the_processes_it_starts_share_one_cache():
    if os.environ.get("POSENC_TEST_COMPILE_CACHE", "1") == "0":
        pytest.skip("POSENC_TEST_COMPILE_CACHE=0: this run has no cache to check")
    folder = os.environ["JAX_COMPILATION_CACHE_DIR"]  # inherited by every env=dict(os.environ)
    assert jax.config.jax_compilation_cache_dir == folder
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"


def test_different_programs_and_options_never_share_an_entry(tmp_path):
    first = _run(tmp_path)
    assert first["out"] == WANT and first["dir"] == str(tmp_path)
    entries = _entries(tmp_path)
    assert first["hits"] == 0 and len(entries) == 4, (first, sorted(entries))

    again = _run(tmp_path)  # a fresh process: every program is read back, none compiled
    assert again["out"] == WANT
    assert again["hits"] >= 4 and again["misses"] == 0, again
    assert _entries(tmp_path) == entries

    flagged = _run(tmp_path, xla_flags="--xla_cpu_enable_fast_math=false")
    assert flagged["out"] == WANT
    assert flagged["hits"] == 0, "an entry compiled under other XLA_FLAGS was reused"
    assert len(_entries(tmp_path)) == 8


def test_an_unreadable_entry_is_compiled_again_not_run(tmp_path):
    _run(tmp_path)
    for path in pathlib.Path(tmp_path).iterdir():
        if path.is_file():
            path.write_bytes(b"not an executable")
    broken = _run(tmp_path)
    assert broken["out"] == WANT and broken["hits"] == 0, broken
    assert "Error reading persistent compilation cache entry" in broken["stderr"]
