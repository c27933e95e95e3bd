"""The engine (`train.engine`) through a minimal third study (tests/train/tally_study: plan,
runner, report, one small file each): it runs end to end, a rerun runs nothing, SIGTERM stops
after the job in progress and the rerun continues, a busy workdir is refused; and the
engine's shared vocabulary (lengths, names, store, timings, FLOPs) by hand."""

import ast
import json
import os
import pathlib
import signal

import ml_collections
import pytest
from tally_study import plan as tally_plan
from tally_study import runner as tally

from posenc_jax.model.config import TransformerConfig
from train.engine import flops, lengths, names, store
from train.workdir_lock import WorkdirBusyError, WorkdirLock


def config():
    return ml_collections.ConfigDict({"base": 64, "rotary_dim": 16,
                                      "methods": "none,linear,yarn", "lengths": "B/2,B,2B,4B"},
                                     type_safe=False)


def test_end_to_end_then_a_rerun_runs_nothing(tmp_path, monkeypatch, capsys):
    calls = []
    real = tally.RUNNERS["wavelength"]
    monkeypatch.setitem(tally.RUNNERS, "wavelength",
                        lambda ctx, job: calls.append(job.name) or real(ctx, job))
    results = tally.run(config(), str(tmp_path))
    assert len(results) == len(calls) == 12
    rows = {job.name: r for job, r in results.items()}
    assert rows["none@256"]["wavelength"] == pytest.approx(rows["none@32"]["wavelength"])
    assert rows["linear@256"]["wavelength"] == pytest.approx(4 * rows["none@256"]["wavelength"],
                                                             rel=1e-5)  # PI stretches 4x
    assert rows["yarn@64"] == {**rows["none@64"], "method": "yarn",
                               "fingerprint": rows["yarn@64"]["fingerprint"]}  # factor 1
    for f in ("results.csv", "report.md", "timings.json", "results/linear@256.json"):
        assert os.path.getsize(tmp_path / f) > 0, f
    assert "tally: 12 of 12 jobs to do" in capsys.readouterr().out
    calls.clear()
    again = tally.run(config(), str(tmp_path))
    assert again == results and calls == []                       # every result reused
    timings = json.loads((tmp_path / "timings.json").read_text())
    assert timings["version"] == 2 and [t["jobs"] for t in timings["invocations"]] == [12, 0]


def test_a_changed_job_runs_again_and_only_it(tmp_path):
    tally.run(config(), str(tmp_path))
    cfg = config()
    cfg.lengths = "B/2,B,2B,8B"   # 4B's jobs are not in the plan; 8B's are new
    (tmp_path / "results" / "none@32.json").write_text('{"fingerprint": "stale"}')
    done = []
    real = tally.RUNNERS["wavelength"]
    tally.RUNNERS["wavelength"] = lambda ctx, job: done.append(job.name) or real(ctx, job)
    try:
        tally.run(cfg, str(tmp_path))
    finally:
        tally.RUNNERS["wavelength"] = real
    assert sorted(done) == ["linear@512", "none@32", "none@512", "yarn@512"]


def test_sigterm_stops_after_the_job_and_a_rerun_continues(tmp_path, monkeypatch):
    real, done = tally.RUNNERS["wavelength"], []

    def first_then_term(ctx, job):
        row = real(ctx, job)
        done.append(job.name)
        if len(done) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return row

    monkeypatch.setitem(tally.RUNNERS, "wavelength", first_then_term)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        tally.run(config(), str(tmp_path))
    assert stop.value.code == 0 and done == ["none@32"]
    assert os.listdir(tmp_path / "results") == ["none@32.json"]
    assert signal.getsignal(signal.SIGTERM) is before          # the handler is given back
    monkeypatch.setitem(tally.RUNNERS, "wavelength", real)
    assert len(tally.run(config(), str(tmp_path))) == 12


def test_a_busy_workdir_is_refused_before_any_job(tmp_path):
    with WorkdirLock(str(tmp_path)), pytest.raises(WorkdirBusyError,
                                                   match="is in use by another run: pid"):
        tally.run(config(), str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [".lock"]


@pytest.mark.parametrize("key, value, error, message", [
    ("lengths", "B,C/0", ValueError, (r"^length 'C/0' must be an int or 'B', '2B', 'B/4' in "
                                     r"config.lengths: a length must be a positive int or a "
                                     r"multiple of B \(B=64\)$")),
    ("lengths", "B/0", ValueError, r"^length 'B/0' in config.lengths divides by zero$"),
    ("lengths", "B/3", ValueError, (r"^length 'B/3' is not a whole number of tokens for B=64 "
                                   r"in config.lengths$")),
    ("lengths", "", ValueError, r"^config.lengths='' names no length$"),
    ("methods", "none,pi", ValueError, (r"^config.methods='none,pi': unknown \['pi'\] \(unknown "
                                       r"method 'pi'; valid: 'none', 'linear'")),
    ("methods", "none,none", ValueError, r"^config.methods='none,none' names an entry twice$"),
    ("methods", "", ValueError, r"^config.methods='' names no method; valid: 'none'"),
    ("methods", 3, TypeError, r"^config.methods must be a comma-separated string, got int: 3$"),
    ("base", 0, ValueError, r"^config.base must be >= 1, got config.base=0$"),
])
def test_bad_config_is_refused_before_any_file(tmp_path, key, value, error, message):
    cfg = config()
    cfg[key] = value
    with pytest.raises(error, match=message):
        tally.run(cfg, str(tmp_path))
    assert not os.listdir(tmp_path)


def test_the_length_grammar_by_hand():
    assert lengths.lengths("L/2, L,2L,2*L,3L/4,100", base="L", value=64,
                           key="config.x") == (32, 48, 64, 100, 128)
    assert lengths.length("C/4", base="C", value=8192) == 2048
    with pytest.raises(ValueError, match=r"^length '1' must be at least 2 tokens, got 1$"):
        lengths.length("1", base="C", value=8192, minimum=2)
    assert names.names("all", key="config.methods", valid=("a", "b"), allow_all=True) == (
        "a", "b")


def test_the_store_keeps_only_fingerprinted_results(tmp_path):
    job = tally_plan.WavelengthJob(method="none", length=8, base=8, rotary_dim=4,
                                   fingerprint="abc")
    s = store.Store(str(tmp_path), "results")
    assert s.get(job) is None
    assert s.put(job, {"x": 1}) == {"x": 1, "fingerprint": "abc"}
    assert s.get(job) == {"x": 1, "fingerprint": "abc"}
    other = tally_plan.WavelengthJob(method="none", length=8, base=8, rotary_dim=4,
                                     fingerprint="abd")
    assert s.get(other) is None and s.found([job, other]) == {job: s.get(job)}
    (tmp_path / "old.json").write_text('[{"jobs": 3}]')  # the extension study's old format
    assert store.append_timing(str(tmp_path / "old.json"), {"jobs": 0}) == [{"jobs": 3},
                                                                             {"jobs": 0}]


def test_flops_by_hand():
    mc = TransformerConfig(vocab_size=100, num_layers=2, embed_dim=8, num_heads=2,
                           num_kv_heads=1, head_dim=4, mlp_dim=16)
    # per token: 2 * (2 layers * (2*8*2*4 + 2*8*1*4 + 3*8*16) + 8*100) = 2 * (2*576 + 800)
    assert flops.matmul_flops(mc, 10) == 10 * 2 * (2 * 576 + 800)
    assert flops.attention_flops(mc, 10) == 2.0 * 2 * 2 * 4 * 100            # causal
    assert flops.attention_flops(mc, 10, causal=False) == 4.0 * 2 * 2 * 4 * 100
    assert flops.dense_forward_flops_per_token(mc, 10) == 2 * (2 * 576 + 800) + 4 * 2 * 2 * 4 * 10
    assert flops.train_flops(mc, 10, 30) == 3 * 30 * flops.dense_forward_flops_per_token(mc, 10)


def _imports(folder: str) -> set[str]:
    root = pathlib.Path(__file__).resolve().parents[2]
    out = set()
    for path in (root / folder).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
    return out


def test_the_studies_share_only_the_engine():
    """Neither study reaches into the other; the engine knows neither."""
    assert not {m for m in _imports("train/engine") if m.startswith(("train.study",
                                                                     "train.extend"))}
    assert not {m for m in _imports("train/study") if m.startswith("train.extend")}
    assert not {m for m in _imports("train/extend") if m.startswith("train.study")}
