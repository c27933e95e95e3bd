"""The length-extrapolation study end to end (train.study.runner), in this process.

One tiny study (configs/study_tiny.py: RoPE and learned, 3 steps, eval at L and 2L, RoPE+YaRN
at 2L, RoPE fine-tuned at 2L with YaRN, and a passkey model per encoding) runs once per module
into a tmp workdir; the other tests read its outputs, rerun it with training and evaluation
forbidden, or break its config and check that nothing is trained before the error. Fixtures:
tests/study/conftest.py; the plan's pure rules: test_study_plan.py; worker processes:
test_study_parallel.py.
"""

import copy
import csv
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
from ml_collections import config_flags  # noqa: F401  (the CLI's dependency)

from train import evaluation, trainer
from train.study import plan as study_plan
from train.study import runner

ROOT = pathlib.Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir, runtime, load_config):
    """(workdir, rows, config) of one tiny study run end to end."""
    config = load_config("study_tiny")
    config.train.dataset.data_dir = data_dir
    workdir = str(tmp_path_factory.mktemp("study"))
    rows = runner.run(config, workdir, progress=False, runtime=runtime)
    return workdir, rows, config


# ------------------------------------------------------------------------- end to end, resume

def test_tiny_study_writes_every_output_well_formed(finished):
    workdir, rows, _ = finished
    with open(os.path.join(workdir, "results.csv"), newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames[:7]) == ("encoding", "scaling", "train_len", "eval_len",
                                                "loss", "ppl", "tokens")
        table = list(reader)
    got = {(r["encoding"], r["scaling"], int(r["finetune_steps"]), int(r["finetune_len"]),
            int(r["eval_len"])) for r in table}
    assert got == {("rope", "none", 0, 0, 24), ("rope", "none", 0, 0, 48),
                   ("rope", "yarn", 0, 0, 48), ("learned", "none", 0, 0, 24),
                   ("learned", "none", 0, 0, 48), ("rope", "yarn", 2, 48, 24),
                   ("rope", "yarn", 2, 48, 48)}
    assert len(table) == len(rows) == 7
    for r in table:
        assert int(r["train_len"]) == 24 and int(r["seed"]) == 0
        if (r["encoding"], r["eval_len"]) == ("learned", "48"):  # past the table: n/a, kept
            assert r["loss"] == r["ppl"] == "" and int(r["tokens"]) == 0
            assert "max_len=24" in r["note"]
        else:
            loss, ppl = float(r["loss"]), float(r["ppl"])
            assert 0 < loss < 10 and math.isclose(ppl, math.exp(loss), rel_tol=1e-4)
            assert int(r["tokens"]) == 288 and r["note"] == ""
    with open(os.path.join(workdir, "passkey.csv"), newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames[:7]) == ("encoding", "scaling", "finetune_steps",
                                                "train_len", "eval_len", "accuracy", "trials")
        keys = list(reader)
    assert {(r["encoding"], r["scaling"], r["finetune_steps"], r["eval_len"]) for r in keys} == {
        ("rope", "none", "0", "24"), ("rope", "none", "0", "48"), ("rope", "yarn", "0", "48"),
        ("rope", "yarn", "1", "24"), ("rope", "yarn", "1", "48"), ("learned", "none", "0", "24"),
        ("learned", "none", "0", "48")}
    for r in keys:
        assert r["trials"] == "8" and (r["accuracy"] == "" if r["note"] else
                                       0 <= float(r["accuracy"]) <= 1)
    report = pathlib.Path(workdir, "report.md").read_text()
    assert "| model | 24 (= L) | 48 |" in report
    for line in ("| `rope` |", "| `rope+yarn` | — |", "| `learned` |", "| `rope+yarn ft@48` |",
                 "## Supported length", "## Passkey retrieval",
                 "| `rope+yarn` | 8-16x, fine-tuning recommended |", "(ft@48, 2 steps)"):
        assert line in report
    assert "n/a" in report and "## Machine" in report and "jax " in report
    assert '"sha256"' in report and "## Timings" in report and "1. 20" in report
    import matplotlib.image
    for name in ("extrapolation.png", "passkey.png"):
        png = pathlib.Path(workdir, name).read_bytes()
        assert png[:8] == PNG_MAGIC and len(png) > 10_000
        assert matplotlib.image.imread(os.path.join(workdir, name)).ndim == 3


def test_a_rerun_reuses_trainings_and_evaluations(finished, forbid_work, runtime):
    workdir, rows, config = finished
    ckpt = pathlib.Path(workdir, "rope", "checkpoints")
    before = {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")}
    again = runner.run(config, workdir, progress=False, runtime=runtime)
    assert [(r["encoding"], r["scaling"], r["eval_len"], str(r["ppl"])) for r in again] == \
        [(r["encoding"], r["scaling"], r["eval_len"], str(r["ppl"])) for r in rows]
    assert {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")} == before


def test_a_lost_evaluation_is_redone_alone(finished, monkeypatch, runtime):
    workdir, rows, config = finished
    lost = pathlib.Path(workdir, "evals", "rope+yarn@48.json")
    old = json.loads(lost.read_text())
    lost.unlink()
    calls = []
    real = evaluation.evaluate_params
    monkeypatch.setattr(trainer, "train_and_evaluate",
                        lambda *a, **k: pytest.fail("retrained a finished model"))
    monkeypatch.setattr(evaluation, "evaluate_params",
                        lambda *a, **k: calls.append(k["seq_len"]) or real(*a, **k))
    again = runner.run(config, workdir, progress=False, runtime=runtime)
    assert calls == [48]
    new = json.loads(lost.read_text())
    assert math.isclose(new["loss"], old["loss"], rel_tol=1e-6)
    assert len(again) == len(rows)


def test_a_different_train_config_in_the_same_workdir_is_refused(finished, forbid_work):
    workdir, _, config = finished
    config = copy.deepcopy(config)
    config.train.seed = 1
    with pytest.raises(ValueError, match=r"different train config \(config.train.seed=0 there, "
                                         r"1 here\); nothing was changed"):  # issue 26
        runner.run(config, workdir, progress=False)


def test_exercise_5_smoke_config_runs(data_dir, tmp_path, runtime):
    import importlib.util

    spec = importlib.util.spec_from_file_location("cfg_ex5", ROOT / "configs" / "study_ex5.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    full = study_plan.make_plan(module.get_config(), str(tmp_path / "full"))
    assert full.encodings == ("sinusoidal", "rope", "alibi") and full.train_len == 512
    assert full.eval_lens == (256, 512, 1024, 2048, 4096)
    assert not full.of_kind("finetune") and not full.of_kind("passkey")
    config = module.get_config("smoke")
    config.encodings, config.scalings = "rope", ""
    config.train.dataset.data_dir = data_dir
    rows = runner.run(config, str(tmp_path / "smoke"), progress=False, runtime=runtime)
    assert [r["eval_len"] for r in rows] == [16, 32, 64, 128, 256]
    assert all(math.isfinite(r["ppl"]) for r in rows)



# ------------------------------------------------------------- validation before any training

@pytest.mark.parametrize("key, value, message", [
    ("encodings", "rope,bogus", r"unknown encoding 'bogus'; valid: 'alibi', .*'learned'"),
    ("encodings", "", r"names no encoding"),
    ("encodings", "rope,rope", r"names an entry twice"),
    ("scalings", "yarn,magic", r"unknown scaling 'magic'; valid: 'linear', 'ntk', 'dynamic'"),
    ("eval_lengths", "L,0", r"eval length '0' must be a positive"),
    ("eval_lengths", "L,L/5", r"eval length 'L/5' is not a whole number of tokens for L=24"),
    ("eval_lengths", "L,long", r"eval length 'long'.*must be a positive int or a multiple"),
    ("eval_lengths", "L,512", r"\[512\] exceed config.eval_num_tokens=288.*zero full windows"),
    ("max_eval_memory_gb", 1e-6, r"eval length 24 with blockwise attention needs about .* GiB"),
    ("eval_attention", "sparse", r"unknown config.eval_attention 'sparse'; valid: '', 'dense'"),
    ("eval_num_tokens", 10**9, r"eval_num_tokens=1000000000 must be < the \d+ tokens"),
])
def test_bad_config_raises_before_any_training(tiny, tmp_path, forbid_work, key, value,
                                               message):
    if key == "eval_num_tokens":
        tiny.eval_lengths = "L"
    tiny[key] = value
    with pytest.raises(ValueError, match=message):
        runner.run(tiny, str(tmp_path), progress=False)
    assert not any(p.is_dir() for p in tmp_path.iterdir())


def test_a_learned_table_shorter_than_L_is_refused(tiny, tmp_path, forbid_work):
    tiny.encoding_kwargs.learned.max_len = 8
    with pytest.raises(ValueError, match=r"'learned' has max_len=8 < the training length L=24"):
        runner.run(tiny, str(tmp_path), progress=False)


@pytest.mark.parametrize("key, value, error, message", [
    ("seeds", "0,x", TypeError, r"config.seeds must be an int, got config.seeds='x'"),
    ("seeds", "1,1", ValueError, r"config.seeds='1,1' names a seed twice"),
    ("finetune.scalings", "none,magic", ValueError,
     r"unknown finetune.scaling 'magic'; valid: 'none', 'linear'"),
    ("finetune.length", "L", ValueError, r"config.finetune.length='L' = 24 must exceed L=24"),
    ("finetune.length", "0L", ValueError,   # issue 26: it said "eval length '0L'"
     r"^config.finetune.length '0L' must be a positive number of tokens, got 0$"),
    ("passkey.min_len", 5, ValueError, r"config.passkey.min_len must be >= 20, got .*=5"),
    ("passkey.lengths", "L/2,L", ValueError,
     r"config.passkey.lengths has 12 < config.passkey.min_len=20"),
])
def test_bad_extension_config_raises_before_any_training(tiny, tmp_path, forbid_work, key,
                                                         value, error, message):
    block, _, name = key.rpartition(".")
    (tiny[block] if block else tiny)[name] = value
    with pytest.raises(error, match=message):
        runner.run(tiny, str(tmp_path), progress=False)
    assert not any(p.is_dir() for p in tmp_path.iterdir())


def test_cli_rejects_a_bad_encoding_override_without_training(data_dir, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "train.study", "--config=configs/study_tiny.py",
         f"--workdir={tmp_path}", "--config.encodings=rope,alibbi",
         f"--config.train.dataset.data_dir={data_dir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "XLA_FLAGS": ""})
    assert out.returncode != 0
    assert "unknown encoding 'alibbi'; valid: 'alibi'" in out.stderr
    assert not any(p.is_dir() for p in tmp_path.iterdir())

