"""The study's worker processes (train.engine.workers): the same rows as one process, a
fine-tune only after its base, SIGTERM and a dead worker end the run cleanly and a rerun
resumes; the scheduling rules as pure functions.

The tiny study (configs/study_tiny.py) runs once in this process (workers=1) as the
reference, and with workers=2 in spawned processes.
"""

import math
import multiprocessing
import os
import pathlib
import signal
import threading
import time
import warnings

import pytest

from train.engine import progress
from train.engine import workers as parallel
from train.runtime import Runtime
from train.study import plan as study_plan
from train.study import runner
from train.study.jobs import FinetuneJob
from train.workdir_lock import WorkdirBusyError, WorkdirLock

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_at(load_config, data_dir):
    """tiny_at(workers): the tiny study with three models (rope, learned, rope.ft-yarn after
    rope; no passkey models), reading this module's corpus."""
    def make(workers):
        config = load_config("study_tiny")
        config.train.dataset.data_dir = data_dir
        config.workers = workers
        config.passkey.enabled = False
        return config
    return make


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_at):
    """The tiny study's rows, run in this process."""
    workdir = str(tmp_path_factory.mktemp("serial"))
    return runner.run(tiny_at(1), workdir, progress=False, runtime=Runtime())


def _key(row):
    return (row["encoding"], row["scaling"], row["finetune_steps"], row["eval_len"])


def _same_rows(got, want):
    assert [_key(r) for r in got] == [_key(r) for r in want]   # plan order kept
    for g, w in zip(got, want):
        if math.isnan(w["loss"]):
            assert math.isnan(g["loss"]) and g["note"] == w["note"]
        else:  # one core per worker may sum in another order than two: float rounding only
            assert math.isclose(g["loss"], w["loss"], rel_tol=1e-4), (_key(g), g, w)


def test_two_workers_give_the_rows_of_one_process(reference, tiny_at, tmp_path, capsys):
    rows = runner.run(tiny_at(2), str(tmp_path), progress=False)
    assert "2 worker processes" in capsys.readouterr().out
    _same_rows(rows, reference)
    ft = pathlib.Path(tmp_path, "rope.ft-yarn", "checkpoints")
    assert ft.is_dir() and (tmp_path / "results.csv").exists()
    assert multiprocessing.active_children() == []


def _when(predicate, action, timeout=120.0):
    """Runs `action` in a thread as soon as `predicate()` holds."""
    def wait():
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return action()
            time.sleep(0.05)
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def _training_started(workdir):
    return lambda: any(pathlib.Path(workdir).glob("*/study_train.json"))


def test_sigterm_stops_every_worker_and_a_rerun_finishes(reference, tiny_at, tmp_path,
                                                         capsys):
    config, workdir = tiny_at(2), str(tmp_path)
    _when(_training_started(workdir), lambda: os.kill(os.getpid(), signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        runner.run(config, workdir, progress=False)
    assert stop.value.code == 0 and "rerun the same command to resume" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) == before
    assert multiprocessing.active_children() == []
    config.workers = 1   # and resumes in one process just as well
    _same_rows(runner.run(config, workdir, progress=False), reference)


def test_a_worker_that_dies_is_an_error_naming_its_model(tiny_at, tmp_path):
    def kill_one():
        children = multiprocessing.active_children()
        if children:
            os.kill(children[0].pid, signal.SIGKILL)

    _when(_training_started(str(tmp_path)), kill_one)
    with pytest.raises(RuntimeError, match=r"the worker (running model '[\w.-]+'|waiting for a "
                                           r"model) died \(exit code -9; out of memory\?\); "
                                           r"rerun to resume"):
        runner.run(tiny_at(2), str(tmp_path), progress=False)
    assert multiprocessing.active_children() == []


def test_a_worker_ended_by_sigterm_outside_training_is_a_stop(tiny_at, tmp_path, capsys):
    """SIGTERM to the process group reaches a worker that is evaluating or starting, which
    has no handler and exits -15: exit 0 and "rerun", not "died (out of memory?)"."""
    def term_all():
        for child in multiprocessing.active_children():   # starting up: no handler yet
            os.kill(child.pid, signal.SIGTERM)

    _when(lambda: multiprocessing.active_children(), term_all)
    with pytest.raises(SystemExit) as stop:
        runner.run(tiny_at(2), str(tmp_path), progress=False)
    assert stop.value.code == 0 and "rerun the same command to resume" in capsys.readouterr().out
    assert multiprocessing.active_children() == []


def test_a_second_study_on_the_same_workdir_is_refused(tiny_at, tmp_path):
    """Before: it ran the first one's evaluations beside it, then failed on a model's lock
    with a worker's traceback."""
    busy = pytest.raises(WorkdirBusyError, match="is in use by another run: pid")
    with WorkdirLock(str(tmp_path)), busy:   # the lock: as if a first study held it
        runner.run(tiny_at(2), str(tmp_path), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


def _children(pid):
    """The pids of the processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _gone(pid):
    """Whether `pid` has exited (a zombie counts: its parent is gone, it is not running)."""
    try:
        stat = (pathlib.Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_workers_exit_when_their_parent_is_killed(data_dir, tmp_path):
    """SIGKILL of the study leaves no worker behind, idle or training (orphans trained on,
    then waited for a model forever, and a rerun found the model's workdir locked)."""
    import subprocess
    import sys

    flags = [f"--config.train.dataset.data_dir={data_dir}", "--config.workers=2",
             "--config.passkey.enabled=False", "--config.train.num_train_steps=500"]
    study = subprocess.Popen(
        [sys.executable, "-m", "train.study", "--config=configs/study_tiny.py",
         f"--workdir={tmp_path}", *flags], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while not _training_started(tmp_path)() and time.monotonic() < end:
            time.sleep(0.05)
        workers = _children(study.pid)
        assert workers, "the study started no worker"
    finally:
        study.kill()
        study.wait()
    end = time.monotonic() + 30
    while not all(_gone(w) for w in workers) and time.monotonic() < end:
        time.sleep(0.1)
    left = [w for w in workers if not _gone(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, f"orphaned workers {left}"


# ------------------------------------------------------------------------------ pure rules


@pytest.mark.parametrize("value, backend, cores, want", [
    (0, "cpu", 2, 2), (0, "cpu", 8, 8), (0, "cpu", 64, 8), (0, "gpu", 16, 1), (0, "tpu", 8, 1),
    (3, "gpu", 1, 3), (1, "cpu", 2, 1)])
def test_workers_auto_is_one_per_core_on_a_cpu_only(value, backend, cores, want):
    assert parallel.resolve_workers(value, backend=backend, cores=cores) == want


@pytest.mark.parametrize("value, error, message", [
    (-1, ValueError, r"config.workers must be >= 0, got config.workers=-1"),
    (None, TypeError, r"config.workers must be an int, got config.workers=None")])
def test_bad_workers_are_refused_before_any_job(tiny_at, tmp_path, value, error, message):
    with pytest.raises(error, match=message):
        runner.run(tiny_at(value), str(tmp_path), progress=False)
    assert not any(tmp_path.iterdir())


def test_the_estimate_counts_the_workers(tiny_at, tmp_path):
    from train.study import report

    plan = study_plan.make_plan(tiny_at(2), str(tmp_path))
    assert parallel.speedup(1) == 1.0 and parallel.speedup(2) == pytest.approx(1.48)
    one = report.summary(plan, plan.jobs)
    two = report.summary(plan, plan.jobs, workers=2, speedup=parallel.speedup(2))
    minutes = [float(t.split("estimated ")[1].split(" min")[0]) for t in (one, two)]
    assert minutes[1] == pytest.approx(minutes[0] / 1.48, abs=0.06)
    assert "min with 2 worker processes" in two and "worker" not in one


def test_the_bar_never_passes_its_total():
    bar = progress.bar(0.3, name="study", progress=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # tqdm warns when it has to clamp
        for amount in (0.1, 0.2, 0.05):  # 0.1 + 0.2 > 0.3 in floats: the order can do it
            progress.advance(bar, amount)
            bar.refresh()
            assert bar.n <= bar.total
    assert bar.n == bar.total
    bar.close()


def test_core_shares_are_disjoint_and_cover_the_cores():
    assert parallel.core_shares([0, 1, 2, 3, 4], 2) == [[0, 2, 4], [1, 3]]
    assert parallel.core_shares([0, 1], 2) == [[0], [1]]
    assert parallel.core_shares([0], 2) == [[], []]   # more workers than cores: not pinned


def test_a_finetune_waits_for_its_base_and_the_costliest_goes_first(tiny_at, tmp_path):
    plan = study_plan.make_plan(tiny_at(2), str(tmp_path))
    bases, cost = parallel.schedule(plan, plan.jobs,
                                  seconds={j: plan.estimate(j) for j in plan.jobs})
    tuned = {j.model: j.base for j in plan.jobs if isinstance(j, FinetuneJob)}
    assert bases == tuned and tuned          # rope.ft-yarn <- rope, ...
    for model, base in tuned.items():
        assert cost[base] > cost[model]      # a base carries its fine-tunes' cost
    pending = parallel.models_to_do(plan, plan.jobs)
    assert pending == list(plan.models)
    untrained = set(pending)
    first = parallel.next_model(pending, ready=lambda m: bases.get(m) not in untrained,
                                cost=cost)
    assert first not in tuned and cost[first] == max(cost[m] for m in pending if m not in tuned)
    assert parallel.next_model(list(tuned), ready=lambda m: bases[m] not in untrained,
                               cost=cost) is None
