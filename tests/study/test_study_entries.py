"""The study's variants (issue 31: a window plus learned sinks; chunks plus a NoPE layer with the
query temperature) and its `longrope-searched` method (issue 35), on the tiny study.

configs/study_tiny.py with `encodings=rope-window-sinks,rope-chunk-nope`, two layers (the chunk
variant has one chunked RoPE layer and one global NoPE layer), `scalings=longrope-searched`, no
fine-tuning or passkey models, runs once per module; the tests read its outputs and weights,
rerun it, and check the plan's configs and errors without training anything.
"""

import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc_jax.model.config import thaw
from train import evaluation, sharding
from train.longrope import fitness
from train.study import plan as study_plan
from train.engine.flops import dense_forward_flops_per_token as flops_per_token
from train.study import report, runner, searched

VARIANTS = ("rope-window-sinks", "rope-chunk-nope")


def _config(load_config, data_dir):
    config = load_config("study_tiny")
    config.train.dataset.data_dir = data_dir
    config.encodings = ",".join(VARIANTS)
    config.scalings = searched.SEARCHED
    config.finetune.scalings = ""
    config.passkey.enabled = False
    config.train.model.num_layers = 2
    return config


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir, runtime, load_config):
    """(workdir, rows, config) of the tiny study of the variants, run end to end."""
    config = _config(load_config, data_dir)
    workdir = str(tmp_path_factory.mktemp("entries"))
    rows = runner.run(config, workdir, progress=False, runtime=runtime)
    return workdir, rows, config


def test_the_plan_builds_each_variant_with_its_attention(load_config, data_dir):
    plan = study_plan.make_plan(_config(load_config, data_dir), "/nonexistent/entries")
    sinks, chunks = (plan.model_configs[v] for v in VARIANTS)
    assert plan.encodings == VARIANTS and plan.train_configs[VARIANTS[0]].model.encoding == "rope"
    assert sinks.attention_sinks and [s.window for s in sinks.layer_specs] == [12, 12]  # L/2
    assert not chunks.attention_sinks
    first, second = chunks.layer_specs
    assert (first.encoding[0], first.chunk, first.temperature) == ("rope", 12, None)
    assert (second.encoding[0], second.chunk, second.temperature) == ("nope", None, (12.0, 0.1))
    # everything else is the encoding's: the same train config but the model keys
    a, b = (plan.train_configs[v].to_dict() for v in VARIANTS)
    assert {k for k in a if a[k] != b[k]} == {"model"}
    searches = plan.of_kind(searched.SearchJob.kind)
    assert [(j.model, j.target_len) for j in searches] == [(v, 48) for v in VARIANTS]
    assert {j.encoding for j in plan.of_kind("eval")} == set(VARIANTS)


def test_the_searched_fine_tune_searches_then_tunes_with_the_factors_found(load_config,
                                                                          data_dir):
    """The paper's recipe as jobs: search at the fine-tune length on the pretrained model (the
    tuned model's first job, so its worker runs it before the fine-tune), fine-tune with the
    found factors, evaluate every length with them (`search` read at run time)."""
    config = _config(load_config, data_dir)
    config.encodings = "rope"
    config.finetune.scalings = f"yarn,{searched.SEARCHED}"
    plan = study_plan.make_plan(config, "/nonexistent/entries")
    name = f"rope.ft-{searched.SEARCHED}"
    search, tune, *evals = plan.jobs_for(name)
    assert (search.kind, search.searched_model, search.target_len) == (
        searched.SearchJob.kind, "rope", 48)
    zero_shot = [j for j in plan.of_kind(search.kind) if j.model == "rope"]
    assert [j.fingerprint for j in zero_shot] == [search.fingerprint]  # the same search
    assert (tune.kind, tune.base, tune.search) == ("finetune", "rope",
                                                   (search.name, search.fingerprint))
    assert [(e.eval_len, e.finetune_len, e.search) for e in evals] == [
        (n, 48, tune.search) for n in (24, 48)]
    assert "scaling" not in plan.train_configs[name].model.encoding_kwargs  # set at run time
    yarn = plan.jobs_for("rope.ft-yarn")
    assert [j.kind for j in yarn] == ["finetune", "eval", "eval"] and not yarn[0].search
    config.passkey.enabled = True  # a passkey model has no searched fine-tune (nor zero-shot)
    assert not study_plan.make_plan(config, "/x").jobs_for(f"rope.passkey.ft-{searched.SEARCHED}")


def test_the_estimate_counts_every_search_evaluation_at_the_search_rate(load_config, data_dir):
    """A search is one compile (`train.longrope.fitness`) and `evaluations` forwards over its
    windows at config.estimate_search_gflops (batch-1 windows: slower than the evaluations'
    rate); the printed estimate adds them (it used to count a compile per evaluation at 1 s,
    and printed 4.9 minutes for a 27.5-minute run)."""
    config = _config(load_config, data_dir)
    config.estimate_search_gflops = 0.25
    plan = study_plan.make_plan(config, "/nonexistent/entries")
    search = plan.of_kind(searched.SearchJob.kind)[0]
    per_window = flops_per_token(plan.model_configs[search.model], 48) * 48
    assert search.compiles == 1 and search.flops == pytest.approx(5 * 2 * per_window)  # 96 // 48
    assert plan.estimate(search) == pytest.approx(search.flops / 0.25e9 + 1.0)
    line = report.summary(plan, plan.jobs)
    minutes = float(line.split("estimated ")[1].split(" min")[0])
    assert minutes == pytest.approx(sum(map(plan.estimate, plan.jobs)) / 60, abs=0.05)
    del config.estimate_search_gflops  # absent: the evaluations' rate
    assert study_plan.make_plan(config, "/x").estimate(search) == pytest.approx(
        search.flops / (config.estimate_gflops * 1e9) + 1.0)


@pytest.mark.parametrize("variant, message", [
    ({"encoding": "rotary"}, "config.variants.bad.encoding='rotary' is not a registered"),
    ({"encoding": "rope", "model": {"encoding": "alibi"}}, "config.variants.bad.model has keys"),
    ({"encoding": "rope", "model": {"sliding_window": "L/5"}},
     "config.variants.bad.model.sliding_window 'L/5' is not a whole number"),
    ({"encoding": "rope", "extra": 1}, "config.variants.bad has unknown keys ['extra']"),
])
def test_a_bad_variant_is_refused_by_name(load_config, data_dir, variant, message):
    config = _config(load_config, data_dir)
    config.variants.bad = variant
    config.encodings = "bad"
    with pytest.raises(ValueError, match=None) as error:
        study_plan.make_plan(config, "/nonexistent/entries")
    assert message in str(error.value)


def test_a_bad_search_setting_is_refused_before_any_job(load_config, data_dir):
    config = _config(load_config, data_dir)
    config.longrope_search.parents = 9  # > population 3
    with pytest.raises(ValueError, match=r"config.longrope_search: parents=9 must be <= "
                                         r"population=3"):
        study_plan.make_plan(config, "/nonexistent/entries")


def test_the_variants_and_the_searched_rows_are_in_the_outputs(finished):
    workdir, rows, _ = finished
    got = {(r["encoding"], r["scaling"], r["eval_len"]) for r in rows}
    assert got == {(v, s, n) for v in VARIANTS for s, n in
                   (("none", 24), ("none", 48), (searched.SEARCHED, 48))}
    assert all(np.isfinite(r["ppl"]) and r["tokens"] == 288 for r in rows)
    report = pathlib.Path(workdir, "report.md").read_text()
    for line in ("| `rope-window-sinks+longrope-searched` |", "## LongRoPE search",
                 "| `rope-chunk-nope` | 48 |", "'attention_sinks': True"):
        assert line in report
    for v in VARIANTS:
        found = json.loads(pathlib.Path(workdir, "evals",
                                        f"{v}+{searched.SEARCHED}@48.search.json").read_text())
        factors = found["long_factor"]
        assert len(factors) == 4 and factors == sorted(factors)  # one per pair, monotone
        assert all(1.0 <= f <= 1.25 * 2 for f in factors) and found["evaluations"] == 5
        assert found["search_ppl"] <= min(found["seed_ppl"].values())  # the seeds were in it
        assert os.path.exists(os.path.join(workdir, v, "longrope-48", "log.jsonl"))


def _params(workdir, config, model, runtime):
    """(train config, setup, trained params, mesh) of one of the study's models."""
    cfg = study_plan.train_config(config, model, 24, seed=config.train.seed)
    mesh = sharding.make_mesh(cfg.mesh)
    setup, params, _ = evaluation.load_params(os.path.join(workdir, model), step=3, config=cfg,
                                              mesh=mesh, runtime=runtime)
    return cfg, setup, params, mesh


def _loss(cfg, graphdef, params, runtime, mesh, rules):
    stream = runtime.stream(cfg.dataset, "test")
    return evaluation.evaluate_params(graphdef, params, stream, seq_len=48, num_tokens=288,
                                      batch_size=8, mesh=mesh, rules=rules,
                                      runtime=runtime)["loss"]


def test_the_sinks_were_trained_and_change_the_loss(finished, runtime):
    workdir, _, config = finished
    cfg, setup, params, mesh = _params(workdir, config, VARIANTS[0], runtime)
    paths = [(p, x) for p, x in jax.tree_util.tree_leaves_with_path(params)
             if "sinks" in jax.tree_util.keystr(p)]
    assert len(paths) == 2 and all(x.shape == (2,) for _, x in paths)  # one per head, layer
    assert all(float(jnp.max(jnp.abs(x))) > 0 for _, x in paths)  # init 0: they got gradients
    before = _loss(cfg, setup.graphdef, params, runtime, mesh, setup.rules)
    moved = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 3.0 if "sinks" in jax.tree_util.keystr(p) else x, params)
    assert abs(_loss(cfg, setup.graphdef, moved, runtime, mesh, setup.rules) - before) > 1e-3


def test_the_chunk_shapes_what_the_chunked_layer_sees(finished, runtime):
    workdir, _, config = finished
    cfg, setup, params, mesh = _params(workdir, config, VARIANTS[1], runtime)
    chunked = _loss(cfg, setup.graphdef, params, runtime, mesh, setup.rules)
    pattern = [dict(e) for e in thaw(cfg.model.layer_pattern)]
    pattern[0]["chunk"] = None  # the same weights, the first layer global
    wide = runtime.setup(cfg, mesh, model_overrides={"layer_pattern": pattern})
    assert abs(_loss(cfg, wide.graphdef, params, runtime, mesh, setup.rules) - chunked) > 1e-4


def test_a_rerun_reuses_the_searches_and_a_lost_result_resumes_its_search(
        finished, runtime, monkeypatch, forbid_work):
    workdir, rows, config = finished

    def no_fitness(*args, **kwargs):
        raise AssertionError("the study evaluated a candidate it should have reused")

    monkeypatch.setattr(fitness.Perplexity, "__call__", no_fitness)
    again = runner.run(config, workdir, progress=False, runtime=runtime)
    assert [str(r["ppl"]) for r in again] == [str(r["ppl"]) for r in rows]
    name = f"{VARIANTS[0]}+{searched.SEARCHED}@48"
    stored = pathlib.Path(workdir, "evals", f"{name}.search.json")
    kept = json.loads(stored.read_text())
    stored.unlink()  # killed after its last generation, before its result was stored
    pathlib.Path(workdir, "evals", f"{name}.json").unlink()
    monkeypatch.undo()  # the search's evaluation reruns, its generations are on disk:
    monkeypatch.setattr(fitness.Perplexity, "__call__", no_fitness)  # no candidate is
    third = runner.run(config, workdir, progress=False, runtime=runtime)
    assert [str(r["ppl"]) for r in third] == [str(r["ppl"]) for r in rows]
    found = json.loads(stored.read_text())
    assert (found["candidate"], found["search_ppl"]) == (kept["candidate"], kept["search_ppl"])
