"""Every benchmark script runs, in its `--smoke` mode (tiny shapes, a step or two), as CI runs
it: a benchmark that breaks fails the suite (issue 20: `train_throughput.py` had been broken by
a refactor and nothing noticed).

To add a benchmark: give it a `--smoke` flag and add one row to SMOKE (the words its output
must contain), or, where another test already runs it, name that test file in ELSEWHERE.
`test_every_benchmark_is_in_the_table` fails for a `benchmarks/*.py` that is in neither.

The scripts run in fresh processes with this checkout on PYTHONPATH and without the 8 fake
devices of conftest.py (a benchmark sees what a user's shell sees). Benchmarks that compare with
PyTorch run their JAX side either way; without torch they must say the torch side was not run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from tests.subprocess_env import cheap_xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
HAVE_TORCH = importlib.util.find_spec("torch") is not None


@dataclasses.dataclass(frozen=True)
class Smoke:
    script: str               # file under benchmarks/
    args: tuple[str, ...]     # its smoke-mode arguments
    prints: tuple[str, ...]   # words its output must contain
    slow: bool = False        # over ~20 s on a loaded 2-core machine (pyproject's `slow`)
    absent: tuple[str, ...] = ()  # words its output must not contain (a failed entry)


SMOKE = [
    Smoke("rope.py", ("--smoke",), ("fastest copy", "of copy bandwidth", "ours: rope.apply")),
    Smoke("attention.py", ("--smoke",), ("dense     64", "blockwise     64"), slow=True),
    Smoke("scan_compile.py", ("--smoke",), ("loop", "scan"), slow=True),
    Smoke("train_throughput.py", ("--smoke",),
          ("tokens_per_sec", "fraction_of_float32_matmul_rate", "final_loss"), slow=True),
    Smoke("vs_pytorch.py", ("--smoke",),
          ("summary", "matmul 128^3") + (("x torch",) if HAVE_TORCH
                                          else ("torch side NOT run", "cannot import torch")),
          slow=True),
    Smoke("kernel_device.py", ("--smoke",), ("kernel/smollm2/D=64", "gemma3_sliding/L=64",
                                              "gpt_oss_sinks/L=64", "llama4_chunked/L=64"),
          slow=True, absent=('"status": "error"',)),  # entries catch their own failures
    Smoke("finetune_memory.py", ("--smoke",),
          ("| 64 | none | chunked |", "| 64 | block | full |", "LoRA remat=none:"), slow=True),
    Smoke("attention_cpu.py", ("--smoke",),
          ("ours auto", "ours blockwise", "torch NOT run", "summary (GFLOP/s")),
    Smoke("pretrained_forward.py", ("--smoke",),
          ("ours: pretrained.load", "torch side NOT run", "x torch = ours / torch",
           "breakdown at L=16", "attention core")),
]
# Benchmarks another test already runs in a smoke mode: {script: the test file that does}.
ELSEWHERE = {
    "attention_device.py": "tests/model/test_pallas_model.py",   # run(smoke=True), in process
    "device_check.py": "tests/test_device_check.py",       # scripts/device_check.sh --smoke
}
# Modules in benchmarks/ that are not scripts: {file: who runs them}.
NOT_SCRIPTS = {
    "torch_twin.py": "the PyTorch model of vs_pytorch.py's torch worker (bench extra only)",
    "device_sections.py": "the sections device_check.py runs",
    "device_extend.py": "the real-model sections device_check.py runs (extension, LongRoPE)",
    "line_worker.py": "the torch-worker protocol attention_cpu.py and pretrained_forward.py share",
    "forward_pieces.py": "pretrained_forward.py --breakdown's per-piece timers (ours, torch)",
}


def _script_names() -> set[str]:
    return {p.name for p in BENCHMARKS.glob("*.py")
            if p.name != "__init__.py" and not p.name.startswith("_")}


def test_every_benchmark_is_in_the_table():
    listed = [s.script for s in SMOKE] + list(ELSEWHERE) + list(NOT_SCRIPTS)
    assert len(listed) == len(set(listed)), sorted(listed)
    assert _script_names() == set(listed), (
        f"not in tests/test_benchmarks.py's table: {sorted(_script_names() - set(listed))}; "
        f"listed but missing: {sorted(set(listed) - _script_names())}")
    for script, test_file in ELSEWHERE.items():
        assert script.removesuffix(".py") in (ROOT / test_file).read_text(), (script, test_file)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", **cheap_xla_flags())
    return env


@pytest.mark.parametrize("smoke", [pytest.param(s, id=s.script.removesuffix(".py"),
                                                marks=[pytest.mark.slow] if s.slow else [])
                                   for s in SMOKE])
def test_benchmark_runs_in_smoke_mode(smoke):
    done = subprocess.run([sys.executable, str(BENCHMARKS / smoke.script), *smoke.args],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, check=False,
                          timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    missing = [word for word in smoke.prints if word not in out]
    assert not missing, f"{smoke.script} --smoke printed none of {missing}:\n{out[-3000:]}"
    found = [word for word in smoke.absent if word in out]
    assert not found, f"{smoke.script} --smoke printed {found}:\n{out[-3000:]}"


@pytest.mark.skipif(HAVE_TORCH, reason="checks the refusal a machine without torch gives")
def test_a_full_comparison_without_torch_refuses_and_says_why():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "vs_pytorch.py"), "--rounds", "1"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, check=False,
                          timeout=120)
    assert done.returncode != 0
    assert "cannot import torch" in done.stderr and "--smoke" in done.stderr, done.stderr
