"""The study's error texts (issue 26), each on a plan alone (nothing trained, seconds):

* a workdir trained with another train config names the keys that changed, the way the
  trainer's ConfigMismatchError does ("config.train.model.embed_dim=32 there, 64 here"), not
  two fingerprints;
* an eval length over `max_eval_memory_gb` never suggests `eval_attention='blockwise'` when
  that is what it already evaluates with.
"""

import os

import pytest
from ml_collections import config_flags  # noqa: F401  (the CLI's dependency)

from train.engine.store import write_json
from train.study import execute, files
from train.study import plan as study_plan
from train.study.jobs import config_diff, train_identity


def _marker(plan, model, *, fingerprint, config):
    workdir = files.Workdir(plan.workdir)
    os.makedirs(workdir.model_dir(model), exist_ok=True)
    write_json(workdir.marker(model), {"fingerprint": fingerprint, "finished": True,
                                       **({} if config is None else {"config": config})})
    return workdir


def test_a_changed_train_config_is_named_key_by_key(tiny, tmp_path):
    plan = study_plan.make_plan(tiny, str(tmp_path))
    job = plan.of_kind("train")[0]
    there = train_identity(plan.train_configs[job.model])
    here_dim = there["model"]["embed_dim"]
    there["model"]["embed_dim"] = here_dim // 2
    there["seed"] = 7
    workdir = _marker(plan, job.model, fingerprint="0123456789abcdef", config=there)
    with pytest.raises(ValueError) as err:
        execute._check_workdir(workdir, job, plan.train_configs[job.model])
    text = str(err.value)
    assert (f"made with a different train config (config.train.model.embed_dim="
            f"{here_dim // 2} there, {here_dim} here; config.train.seed=7 there, 0 here); "
            "nothing was changed") in text, text
    assert "fingerprint" not in text and job.model in text and "another --workdir" in text


def test_an_old_marker_without_its_config_still_says_which_fingerprints(tiny, tmp_path):
    plan = study_plan.make_plan(tiny, str(tmp_path))
    job = plan.of_kind("train")[0]
    workdir = _marker(plan, job.model, fingerprint="0123456789abcdef", config=None)
    with pytest.raises(ValueError, match=f"fingerprint 0123456789abcdef there, "
                                         f"{job.fingerprint} here"):
        execute._check_workdir(workdir, job, plan.train_configs[job.model])


def test_config_diff_names_nested_and_absent_keys():
    assert config_diff({"a": 1, "m": {"e": 32, "x": "y"}}, {"a": 1, "m": {"e": 64}, "b": 2}) == [
        "config.train.b=<absent> there, 2 here",
        "config.train.m.e=32 there, 64 here",
        "config.train.m.x='y' there, <absent> here"]
    assert config_diff({"a": [1, 2]}, {"a": [1, 2]}) == []


@pytest.mark.parametrize("eval_attention, fix", [
    ("blockwise", "; lower eval_batch_tokens or eval_block_size, or drop the length"),
    ("dense", "; use eval_attention='blockwise', lower eval_batch_tokens, or drop the length"),
])
def test_the_memory_error_never_suggests_the_attention_it_already_uses(tiny, tmp_path,
                                                                       eval_attention, fix):
    tiny.encodings = "rope"
    tiny.eval_attention = eval_attention
    tiny.max_eval_memory_gb = 1e-6
    plan = study_plan.make_plan(tiny, str(tmp_path))
    with pytest.raises(ValueError) as err:
        execute._check_memory(plan, 1)
    text = str(err.value)
    assert f"with {eval_attention} attention needs about" in text and text.endswith(fix), text
    if eval_attention == "blockwise":
        assert "use eval_attention" not in text
