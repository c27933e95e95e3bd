"""Strict mode for every test: 8 fake CPU devices and no implicit rank promotion; and one
persistent compilation cache for the whole run.

The device count must be set before JAX initialises its backends, so it is done here at
import time, before any test module imports jax.

The cache: JAX writes every program it compiles to `<checkout>/.jax_cache/` (ignored by git)
and any later process with the same program reads it back instead of compiling. The settings
go into the environment, so the pytest-xdist workers and every process a test starts (the
benchmark smokes, `python -m train`, the study's workers, device_check.sh) share it.
`POSENC_TEST_COMPILE_CACHE=0` turns it off; a JAX_COMPILATION_CACHE_DIR already set wins.
Why a hit cannot make a failing test pass: JAX's key (jax/_src/cache_key.py) is a sha256 of
the program's StableHLO (shapes, dtypes, shardings and constants included), the jax/jaxlib
and backend versions, XLA_FLAGS, the serialized compile options (compiler_options such as
`xla_backend_optimization_level`, the device assignment) and the devices' kind; the value is
what XLA compiled from exactly that input. Programs with host callbacks are never written;
an unreadable entry is a warning and a fresh compile. tests/test_compile_cache.py checks that
different programs and different options never share an entry. One visible difference: a
read-back executable's `as_text()` lacks the stack-frame lines (source file and line of each
op); no test reads a compiled program's text (tests read lowered text, which is not cached).
"""

import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
CACHE_ENV = {
    "JAX_COMPILATION_CACHE_DIR": str(pathlib.Path(__file__).resolve().parents[1] / ".jax_cache"),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
if os.environ.get("POSENC_TEST_COMPILE_CACHE", "1") != "0":
    for _key, _value in CACHE_ENV.items():
        os.environ.setdefault(_key, _value)

# Cheap compiles (issue 36): most tests compile many small programs and run each once, so
# compiling is most of the suite's time. XLA:CPU's cheap settings make a compile ~5x cheaper:
# LLVM at -O0 without its expensive passes (JAX's `jax_disable_most_optimizations`) and the
# older loop emitters instead of the MLIR fusion emitters. The HLO passes (fusion, layout,
# buffer assignment) are XLA's usual ones; only the machine code differs, and with it the
# rounding of a float op here and there (every gradient leaf of a tiny transformer moved by at
# most 8.6e-7, measured): the tests' tolerances are unchanged.
# The settings go into the environment, so every process a test starts inherits them (unless
# the test sets XLA_FLAGS itself), and they are in the persistent cache's key (XLA_FLAGS and
# the compile options), so a cheap program never answers an optimised compile. A test marked
# `optimized_compile` (bit-for-bit comparisons with XLA's optimised output, real models that run
# long, the blockwise backward's NaN at O0: docs/test_time.md) runs with XLA's defaults. POSENC_TEST_CHEAP_COMPILE=0 runs everything with them.
CHEAP_COMPILE = os.environ.get("POSENC_TEST_CHEAP_COMPILE", "1") != "0"
CHEAP_XLA_FLAG = "--xla_cpu_use_fusion_emitters=false"
if CHEAP_COMPILE:
    os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += " " + CHEAP_XLA_FLAG

import contextlib
import json
import time

import hypothesis
import jax
import pytest
from jax import monitoring
from jax._src import compiler as _jax_compiler

jax.config.update("jax_numpy_rank_promotion", "raise")
if os.environ.get("POSENC_TEST_COMPILE_CACHE", "1") != "0":  # in case a plugin imported jax first
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                      int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))

hypothesis.settings.register_profile(
    "default", max_examples=25, deadline=None, print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.register_profile(
    "thorough", max_examples=300, deadline=None, print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# Files whose every test counts as `slow` (pyproject's marker), so `scripts/test.sh --quick`
# (`-m "not slow and not multiprocess"`) leaves them to CI: seconds of one pytest process,
# measured 2026-12-03 per file (issue 36's note), and what the time is.
SLOW_FILES = {
    "tests/model/test_kernel_faults.py": "325 s: the Pallas kernel interpreted, ~20 programs",
    "tests/pretrained/test_pretrained_real.py": "156 s: two real models compiled",
    "tests/train/test_train_faults.py": "75 s: `python -m train` killed and resumed",
    "tests/study/test_study_parallel.py": "a study in worker processes",
    "tests/study/test_study_e2e.py": "a tiny study end to end, then the exercise-5 smoke",
}


# The files that take longest in one pytest worker, longest first: they run first.
# scripts/test.sh hands whole files to the two workers (`--dist loadfile`, in this order), so a
# module's fixtures (a real model, a finished study) are built once, not once per worker, and
# no long file starts last while the other worker sits idle. Seconds of a worker: the fresh
# clone's run of 2026-12-05 (docs/test_time.md), cold cache, both workers busy; the notebooks
# come next, then every other file in collection order. Re-sort it from a run's `--durations`
# (or POSENC_TEST_COMPILE_REPORT's per-test seconds) when it drifts.
FIRST = (
    "tests/train/test_finetune_smollm2.py",            # 84 s: one test, two processes
    "tests/train/test_train_faults.py",                # 63 s: `python -m train` killed
    "tests/test_benchmarks.py",                        # 56 s: ten benchmark smokes
    "tests/pretrained/test_pretrained_real.py",        # 55 s: two real models
    "tests/study/test_study_parallel.py",              # 54 s: a study in workers
    "tests/train/test_finetune_from_checkpoint.py",    # 52 s
    "tests/model/test_context_parallel.py",            # 41 s
    "tests/test_device_check.py",                      # 40 s: the device script's smoke
    "tests/model/test_layer_attention_combined.py",    # 38 s
    "tests/train/test_context_parallel_auto.py",       # 33 s
    "tests/model/test_attention.py",                   # 29 s
    "tests/train/test_finetune_faults.py",             # 29 s
)


def _first_rank(item, root: pathlib.Path) -> int:
    """FIRST's files by their place, then the notebooks (`--nbmake`: each starts a kernel, tens
    of seconds), then every other file: many short files make an even end for two workers."""
    path = pathlib.Path(str(item.path))
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else ""
    if rel in FIRST:
        return FIRST.index(rel)
    return len(FIRST) + (0 if path.suffix == ".ipynb" else 1)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    """FIRST's files go first (a stable sort: every other file keeps its place). SLOW_FILES'
    tests get the `slow` marker. Tests marked `full` (the exhaustive cases past what CI's 12
    minutes hold; each file says which cover the suite keeps) run only with
    POSENC_TEST_FULL=1."""
    root = pathlib.Path(__file__).resolve().parents[1]
    items.sort(key=lambda item: _first_rank(item, root))
    for item in items:
        path = pathlib.Path(str(item.path))
        if path.is_relative_to(root) and path.relative_to(root).as_posix() in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("POSENC_TEST_FULL") == "1":
        return
    skip = pytest.mark.skip(reason="exhaustive case: POSENC_TEST_FULL=1 runs it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


# POSENC_TEST_COMPILE_REPORT=FILE: one JSON line per test (its worker's pid, the seconds of the
# test, and of it the seconds JAX spent tracing, lowering to MLIR and compiling with XLA, the
# number of XLA compiles, and the persistent cache's hits and misses): where a file's time goes.
# Processes a test starts are not counted (their seconds show in the test's own). Off by default.
_COMPILE = {"trace_s": 0.0, "lower_s": 0.0, "compile_s": 0.0, "compiles": 0, "hits": 0,
            "misses": 0}
_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
           "/jax/core/compile/backend_compile_duration": "compile_s",
           "/jax/compilation_cache/cache_hits": "hits",
           "/jax/compilation_cache/cache_misses": "misses"}


def _on_duration(event, duration, **_):
    if event in _EVENTS:
        _COMPILE[_EVENTS[event]] += duration
        _COMPILE["compiles"] += event.endswith("backend_compile_duration")


def _on_event(event, **_):
    if event in _EVENTS:
        _COMPILE[_EVENTS[event]] += 1


if os.environ.get("POSENC_TEST_COMPILE_REPORT"):
    monitoring.register_event_duration_secs_listener(_on_duration)
    monitoring.register_event_listener(_on_event)


def _report(item, start):
    """Writes the test's line of POSENC_TEST_COMPILE_REPORT (setup, call and teardown)."""
    line = {"test": item.nodeid, "pid": os.getpid(), "s": time.perf_counter() - start,
            **_COMPILE}
    with open(os.environ["POSENC_TEST_COMPILE_REPORT"], "a") as f:
        f.write(json.dumps(line) + "\n")


def _optimized_compile_options(original):
    """`get_compile_options` with XLA:CPU's default emitters over the suite's XLA_FLAGS."""
    def get_compile_options(*args, env_options_overrides=None, **kwargs):
        overrides = {"xla_cpu_use_fusion_emitters": True, **(env_options_overrides or {})}
        return original(*args, env_options_overrides=overrides, **kwargs)
    return get_compile_options


_MODE = {"optimized": False}


def _enter(*, optimized: bool) -> None:
    """Empties JAX's in-memory caches (jit, tracing, lowering) when the compile mode changes."""
    if _MODE["optimized"] != optimized:
        jax.clear_caches()
        _MODE["optimized"] = optimized


@contextlib.contextmanager
def _optimized(item):
    """For a test marked `optimized_compile`: XLA's default compiles (see CHEAP_COMPILE) in this
    process and in the processes it starts, from its setup (module fixtures built there
    included) to its teardown. JAX's in-memory caches do not key on these settings, so they
    are emptied whenever a worker goes from one mode to the other (`_enter`): a program compiled
    cheaply for an earlier test is never handed to a marked one (the persistent cache keys on
    the settings, so its entries stay apart)."""
    if not CHEAP_COMPILE or item.get_closest_marker("optimized_compile") is None:
        _enter(optimized=False)
        yield
        return
    flag = "jax_disable_most_optimizations"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_jax_compiler, "get_compile_options",
                      _optimized_compile_options(_jax_compiler.get_compile_options))
        patch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
        patch.setenv("XLA_FLAGS", " ".join(
            f for f in os.environ["XLA_FLAGS"].split() if f != CHEAP_XLA_FLAG))
        jax.config.update(flag, False)
        _enter(optimized=True)
        try:
            yield
        finally:
            jax.config.update(flag, True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Runs the test (setup, call, teardown) in its compile mode (`_optimized`), then writes
    its line of POSENC_TEST_COMPILE_REPORT when that is set."""
    for key in _COMPILE:
        _COMPILE[key] = 0
    start = time.perf_counter()
    with _optimized(item):
        yield
    if os.environ.get("POSENC_TEST_COMPILE_REPORT"):
        _report(item, start)


def pytest_configure(config):
    config.addinivalue_line("markers", "optimized_compile: compiled with XLA's default "
                            "optimisations, not the suite's cheap ones (tests/conftest.py)")
