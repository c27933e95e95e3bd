"""The study's plan (train.study.plan): a pure function of the config, with the rules it
applies (lengths, scalings, seeds, what each encoding declares), the full default study's
shape, and what importing the study's modules must not change. Nothing here trains.
"""

import copy
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from ml_collections import config_flags  # noqa: F401  (the CLI's dependency)

from posenc_jax._frozen import thaw
from posenc_jax.encodings import rope_scaling
from train.engine import scalings
from train.runtime import Runtime
from train.study import plan as study_plan

from configs import study as study_config

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_parse_lengths_golden():
    assert study_plan.parse_lengths("L/2,L,2L,4L,8L,16L", train_len=64) == (
        32, 64, 128, 256, 512, 1024)
    assert study_plan.parse_lengths("100, 2*L, L", train_len=64) == (64, 100, 128)


@pytest.mark.parametrize("factor", [2.0, 16.0])
def test_scaling_rules(factor):
    d, length = 16, 64
    cfgs = {m: scalings.scaling_config(m, factor=factor, train_len=length, rotary_dim=d)
            for m in scalings.methods()}
    assert set(cfgs) == set(rope_scaling.methods(stretchable=True))
    assert set(cfgs) == set(rope_scaling.methods()) - {"default", "proportional"}
    for method, cfg in cfgs.items():
        assert cfg["rope_type"] == method and cfg["factor"] == factor
    for method in ("dynamic", "yarn", "llama3", "longrope"):
        assert cfgs[method]["original_max_position_embeddings"] == length
    long_ = np.asarray(cfgs["longrope"]["long_factor"])
    assert long_.shape == (d // 2,) and long_[0] == 1.0 and math.isclose(long_[-1], factor)
    assert cfgs["longrope"]["short_factor"] == [1.0] * (d // 2)
    # LongRoPE's rule has NTK's frequencies (only the attention factor differs) at s*L.
    ntk, ntk_af = rope_scaling.frequencies(cfgs["ntk"], rotary_dim=d, base=10000.0)
    lr, lr_af = rope_scaling.frequencies(cfgs["longrope"], rotary_dim=d, base=10000.0,
                                         seq_len=int(factor * length))
    np.testing.assert_allclose(np.asarray(lr), np.asarray(ntk), rtol=1e-5)
    assert float(ntk_af) == 1.0
    assert math.isclose(float(lr_af), math.sqrt(1 + math.log(factor) / math.log(length)),
                        rel_tol=1e-6)
    for method, cfg in cfgs.items():  # every rule gives a dict the library accepts
        rope_scaling.validate(cfg, rotary_dim=d)
    over = scalings.scaling_config("dynamic", factor=factor, train_len=length, rotary_dim=d,
                                     overrides={"factor": 2.0})
    assert over["factor"] == 2.0


def test_default_config_plans_the_full_study(data_dir, load_config):
    config = load_config("study")
    plan_cfg = copy.deepcopy(config)
    plan_cfg.train.dataset.kwargs.max_files = 40  # plan only: nothing is trained
    plan_cfg.train.dataset.data_dir = data_dir
    plan_cfg.eval_num_tokens = 2048
    plan = study_plan.make_plan(plan_cfg, "/nonexistent/study")
    import posenc_jax

    assert plan.encodings[:7] == ("sinusoidal", "learned", "rope", "alibi", "t5", "shaw", "nope")
    # config.variants are entries too, but the CPU default leaves them (and the searched
    # method) out to keep its size; `with_variants_and_search` puts them back
    assert set(plan.encodings) == set(posenc_jax.names()) - {"mrope"}
    assert not plan.of_kind("longrope_search")
    full = study_config.with_variants_and_search(copy.deepcopy(plan_cfg))
    plan = study_plan.make_plan(full, "/nonexistent/study")
    variants = {"rope-window-sinks", "rope-chunk-nope"}
    assert set(plan.encodings) == set(posenc_jax.names()) - {"mrope"} | variants
    assert plan.eval_lens == (32, 64, 128, 256, 512, 1024) and plan.seeds == (0,)
    n, scaled = len(plan.encodings), _scaled(plan)
    evals, keys = plan.of_kind("eval"), plan.of_kind("passkey")
    tunes = plan.of_kind("finetune")
    lm_tunes = [j for j in tunes if ".passkey" not in j.model]
    # 7 zero-shot methods (6 rules, and the searched one on perplexity models only, after
    # its search) x 4 lengths past L per scaled encoding, 6 lengths per fine-tune
    assert len(evals) == n * 6 + scaled * 7 * 4 + len(lm_tunes) * 6
    searches = plan.of_kind("longrope_search")
    assert len(searches) == scaled * 4 and {j.target_len for j in searches} == {128, 256, 512,
                                                                               1024}
    for job in (j for j in evals if j.search):
        assert plan.jobs.index(job) == plan.jobs.index(
            next(s for s in searches if s.name == job.search[0])) + 1  # right after it
    assert len(keys) == n * 4 + scaled * 6 * 3 + (len(tunes) - len(lm_tunes)) * 4
    assert sum(1 for i in evals if "max_len" in i.note) == 4  # learned at 128 .. 1024
    assert sum(1 for i in keys if "max_len" in i.note) == 3  # learned at 128 .. 512
    assert len(plan.of_kind("train")) == 2 * n and len(tunes) <= 12 * scaled
    # A method an encoding refuses (mrope: the length-dependent ones) is an n/a row with the
    # encoding's reason, and is not fine-tuned; every other method is fine-tuned.
    for enc in (e for e in plan.encodings
                if scalings.takes_scaling(plan.model_configs[e].layer_encoding(0))):
        refused = {j.scaling for j in evals if j.encoding == enc and j.note}
        assert all("n/a (" in j.note for j in evals if j.encoding == enc and j.note)
        tuned = {j.model.split(".ft-")[1] for j in lm_tunes if j.base == enc}
        assert tuned == {"none", "linear", "ntk", "yarn", "longrope", "llama3"} - refused, enc
    assert not {j.scaling for j in evals if j.encoding == "rope" and j.note}
    models = {(c.model.to_dict()["num_layers"], c.seed, c.num_train_steps, c.seq_len)
              for m, c in plan.train_configs.items() if m in plan.encodings}
    assert len(models) == 1  # everything but the encoding is shared
    assert plan.train_configs["learned"].model.encoding_kwargs.max_len == 64
    tuned = plan.train_configs["rope.ft-yarn"].to_dict()
    base = plan.train_configs["rope"].to_dict()
    assert {k for k in base if base[k] != tuned[k]} == {"seq_len", "num_train_steps", "model",
                                                        "batch_size"}  # config.finetune.batch_size
    assert (tuned["seq_len"], tuned["num_train_steps"]) == (256, 660)
    assert tuned["model"]["encoding_kwargs"]["scaling"]["factor"] == 4.0
    assert plan.train_configs["rope.passkey"].dataset.packed


def _scaled(plan) -> int:
    """How many encodings of the plan take a RoPE scaling."""
    return sum(scalings.takes_scaling(plan.model_configs[e].layer_encoding(0))
               for e in plan.encodings)


_FILE_EVENTS = ("open", "os.mkdir", "os.listdir", "os.scandir", "os.remove", "os.rename",
                "os.rmdir", "os.chmod", "os.utime", "shutil.", "subprocess.Popen")

_WATCHING: list[list] = []  # the audit hook below records only while a list is pushed here


def _audit(event, args):
    if _WATCHING and event.startswith(_FILE_EVENTS):
        _WATCHING[-1].append((event, args[:1]))


@pytest.fixture(scope="module")
def file_events():
    """A context manager recording every file event (open, mkdir, listdir, ...) inside it."""
    import contextlib

    sys.addaudithook(_audit)  # cannot be removed; inert while _WATCHING is empty

    @contextlib.contextmanager
    def watch():
        _WATCHING.append([])
        try:
            yield _WATCHING[-1]
        finally:
            _WATCHING.pop()

    return watch


def test_the_plan_is_a_pure_function_of_the_config(monkeypatch, tmp_path, file_events,
                                                   load_config):
    import jax

    from train import data, sharding

    config = load_config("study")
    config.train.dataset.data_dir = str(tmp_path / "no_data_here")
    before = copy.deepcopy(config.to_dict())
    workdir = tmp_path / "study"
    study_plan.make_plan(config, str(workdir))  # warm up: first-time imports read .py files

    def forbidden(*args, **kwargs):
        raise AssertionError("the plan used a device, built a mesh, compiled or read data")

    for module, name in ((jax, "devices"), (jax, "local_devices"), (jax, "device_count"),
                         (jax, "make_mesh"), (jax, "device_put"), (jax, "jit"),
                         (sharding, "make_mesh"), (data, "get_source"),
                         (data, "config_stream"), (data, "corpus_identity")):
        monkeypatch.setattr(module, name, forbidden)
    live = len(jax.live_arrays())
    with file_events() as events:
        a = study_plan.make_plan(config, str(workdir))
        b = study_plan.make_plan(copy.deepcopy(config), str(workdir))
    assert events == []
    assert len(jax.live_arrays()) == live
    assert a.jobs == b.jobs and hash(a.jobs) == hash(b.jobs)
    n, scaled = len(a.encodings), _scaled(a)
    assert [j.kind for j in a.jobs].count("train") == 2 * n
    assert len(a.jobs) == sum(len(a.of_kind(k)) for k in ("train", "finetune", "eval", "passkey",
                                                          "longrope_search"))
    assert 0 < len(a.of_kind("finetune")) <= 12 * scaled
    assert len({j.name for j in a.jobs}) == len(a.jobs)  # every job has its own result file
    assert config.to_dict() == before  # the config is not changed
    assert list(tmp_path.iterdir()) == []  # neither the workdir nor the data dir was made
    c = copy.deepcopy(config)
    c.train.seed = 1  # another config: other trainings, other evaluations
    jobs_c = study_plan.make_plan(c, str(workdir)).jobs
    assert [j.name for j in jobs_c] == [j.name for j in a.jobs]
    assert not set(jobs_c) & set(a.jobs)


def test_the_plan_reads_what_each_encoding_declares(tiny, tmp_path):
    """Scaled evaluations go to every encoding that takes a scaling; a bounded encoding's
    evaluations past its positions are n/a; length kwargs come from the config."""
    tiny.encodings = "rope,learned,alibi"
    tiny.length_kwargs.learned = ""
    tiny.encoding_kwargs.learned.max_len = 36  # between L=24 and 2L=48
    plan = study_plan.make_plan(tiny, str(tmp_path))
    evals = plan.of_kind("eval")
    assert {(j.encoding, j.scaling) for j in evals if j.scaling != "none"} == {("rope", "yarn")}
    assert {j.model for j in plan.of_kind("finetune")} == {"rope.ft-yarn", "rope.passkey.ft-yarn"}
    assert [(j.eval_len, bool(j.note)) for j in evals if j.encoding == "learned"] == [
        (24, False), (48, True)]
    assert "max_len=36" in next(j.note for j in evals if j.note)
    assert plan.train_configs["learned"].model.encoding_kwargs.to_dict() == {"max_len": 36}
    tiny.encoding_kwargs.learned = {}
    tiny.length_kwargs.learned = "max_len"
    assert study_plan.make_plan(tiny, str(tmp_path)).train_configs[
        "learned"].model.encoding_kwargs.to_dict() == {"max_len": 24}


def test_seeds_multiply_the_models_and_keep_the_first_seeds_names(tiny, tmp_path):
    tiny.seeds = "0,1"
    plan = study_plan.make_plan(tiny, str(tmp_path))
    trains = [j.model for j in plan.of_kind("train")]
    assert trains == ["rope", "rope.passkey", "learned", "learned.passkey", "rope.s1",
                      "rope.s1.passkey", "learned.s1", "learned.s1.passkey"]
    assert plan.train_configs["rope.s1"].seed == 1 and plan.train_configs["rope"].seed == 0
    assert {j.seed for j in plan.of_kind("eval") if j.model.startswith("rope.s1")} == {1}
    assert len({j.name for j in plan.jobs}) == len(plan.jobs)


def test_an_encoding_that_cannot_run_the_eval_attention_keeps_its_own(tiny, tmp_path):
    """CoPE reads whole rows of logits: under eval_attention='blockwise' it is scored with the
    attention it was trained with (dense) instead of failing at its first evaluation."""
    tiny.encodings = "cope,alibi"
    tiny.eval_attention = "blockwise"
    plan = study_plan.make_plan(tiny, str(tmp_path))
    attention = {j.encoding: (thaw(j.overrides) or {}).get("attention", "as trained")
                 for j in plan.of_kind("eval")}
    assert attention == {"cope": "as trained", "alibi": "blockwise"}


def test_the_runtime_owns_every_cache_and_bounds_it(data_dir):
    import ml_collections

    from train import data

    dataset = ml_collections.ConfigDict({"name": "python_stdlib", "data_dir": data_dir,
                                         "max_tokens": 4096, "kwargs": {"max_files": 40}})
    runtime = Runtime(max_streams=1)
    first = runtime.stream(dataset, "test")
    assert runtime.stream(dataset, "test") is first  # kept
    runtime.stream(dataset, "validation")
    assert runtime.stream(dataset, "test") is not first  # bounded: the oldest was dropped
    assert data.config_stream(dataset, "test") is not data.config_stream(dataset, "test")
    np.testing.assert_array_equal(first.tokens, data.config_stream(dataset, "test").tokens)


_IMPORT_PROBE = """
import logging, signal, sys, threading
def loggers():
    names = [None, *logging.root.manager.loggerDict]
    out = {}
    for n in names:
        lg = logging.getLogger(n)
        out[n] = (len(getattr(lg, "filters", [])), len(getattr(lg, "handlers", [])),
                  getattr(lg, "level", None))
    return out
import jax, flax, optax, numpy, tensorflow_datasets, tqdm, ml_collections, matplotlib  # noqa
import absl.flags, absl.logging, orbax.checkpoint  # third-party effects are theirs
import posenc_jax
before = (loggers(), signal.getsignal(signal.SIGTERM), threading.active_count())
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
after_loggers = loggers()
changed = {n: (before[0].get(n), v) for n, v in after_loggers.items()
           if before[0].get(n, (0, 0, logging.NOTSET)) != v}
from jax._src import xla_bridge
assert not changed, f"loggers changed: {changed}"
assert signal.getsignal(signal.SIGTERM) == before[1], "SIGTERM handler changed"
assert threading.active_count() == before[2], "threads started"
assert not xla_bridge._backends, "a JAX backend was initialised"
print("ok")
"""


def test_importing_the_modules_changes_nothing_global():
    """No logger, signal handler, thread or JAX backend changes when the data, state, step,
    runtime and study-plan/report modules are imported (a fresh process; train.checkpoint,
    which the runner imports, is issue 15's)."""
    modules = ["train.data", "train.datasets.file_corpus", "train.datasets.synthetic",
               "train.datasets.tfds_text", "train.state", "train.step", "train.runtime",
               "train.evaluation", "train.study.plan", "train.study.report",
               "train.study.table", "train.study.files"]
    out = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, *modules], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "XLA_FLAGS": ""})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]

