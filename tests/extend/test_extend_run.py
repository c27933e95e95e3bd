"""train.extend end to end on a tiny random model (`load` stubbed by one built here): the
files it writes, the chunked loss against the model's logits, resume after SIGTERM."""

import os
import signal
import types

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import extend_smollm2
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.transformer import Transformer
from train.extend import measure, readme, runner, table
from train.extend.settings import Facts

_BUILT = {}


class SmokeTokenizer:
    """One id per whitespace-led word (first sight order, wrapping at 125 + 3), BOS 1: short
    passkey prompts for a tiny model (was train.extend.finetune's, before that file became a
    config of the one fine-tuning path)."""

    bos_id, eos_id = 1, 2

    def __init__(self):
        self.ids, self.words = {}, {}

    def encode(self, text):
        out = []
        for word in text.replace("\n", " \n ").split(" "):
            if word:
                i = self.ids.setdefault(" " + word, 3 + len(self.ids) % 125)
                self.words.setdefault(i, " " + word)
                out.append(i)
        return out

    def decode(self, ids):
        return "".join(self.words.get(i, "?") for i in ids)


def tiny_load(calls=None):
    def load(path, *, dtype="float32", rope_scaling=None):
        if calls is not None:
            calls.append(rope_scaling)
        kwargs = {"base": 1000.0, **({"scaling": rope_scaling} if rope_scaling else {})}
        cfg = TransformerConfig(vocab_size=128, num_layers=2, embed_dim=32, num_heads=4,
                                num_kv_heads=2, mlp_dim=64, encoding="rope",
                                encoding_kwargs=kwargs, attention="blockwise", block_size=16)
        if "state" not in _BUILT:  # one init per process; rope has no params to scale
            _BUILT["state"] = nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)))
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
        return types.SimpleNamespace(model=nnx.merge(graphdef, _BUILT["state"]),
                                     tokenizer=SmokeTokenizer(), config=cfg, hf_config={})
    return load


def tiny_facts(path):
    """The stub file's header facts: C = 32, rotary dim 8 (the model `tiny_load` builds)."""
    return Facts(context=32, rotary_dim=8)


def tiny_config(tmp_path):
    (tmp_path / "tiny.gguf").write_text("stub")
    config = extend_smollm2.get_config()
    config.model.smollm2.update(file="tiny.gguf", context=32, rotary_dim=8, add_bos=True)
    config.pretrained_dir = str(tmp_path)
    config.methods = "none,linear,dynamic"
    config.lengths = "C/2,C,2C"
    config.passkey.update(lengths="2C", depths="0,1", max_new_tokens=6)
    config.calibrate_len = 16
    config.calibrate_attention_len = 64
    return config


def test_chunked_loss_equals_the_logits_and_is_causal():
    model = tiny_load()("x").model
    ids = np.random.default_rng(0).integers(3, 128, 301)
    full = measure.position_nll(model, ids, chunk=64)
    logits = np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(ids[None, :-1])),
                        np.float64)[0]  # one compiled forward, not op by op
    direct = (np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))
              + logits.max(-1) - logits[np.arange(300), ids[1:]])
    np.testing.assert_allclose(full, direct, rtol=1e-4, atol=1e-4)  # the model's own head
    np.testing.assert_allclose(measure.position_nll(model, ids[:101]), full[:100],
                               rtol=1e-5, atol=1e-5)  # why `none`'s prefixes are its rows


def test_scanned_layers_give_the_same_losses_with_the_same_params():
    """config.scan_layers (what the device run sets: one layer compiled, not every one)."""
    model = tiny_load()("x").model
    scanned = runner.with_attention(model, "", 0, True)
    assert scanned.config.scan_layers and not model.config.scan_layers
    assert runner.with_attention(model, "", 0, False) is model
    ids = np.random.default_rng(1).integers(3, 128, 97)
    np.testing.assert_allclose(measure.position_nll(scanned, ids),
                               measure.position_nll(model, ids), rtol=1e-5, atol=1e-5)


def test_end_to_end_then_rerun_does_nothing(tmp_path, capsys):
    config, workdir = tiny_config(tmp_path), str(tmp_path / "ext")
    calls = []
    rows = runner.run(config, workdir, load=tiny_load(calls), inspect=tiny_facts,
                      progress=False)
    out = capsys.readouterr().out
    assert "estimated" in out and "GFLOP/s" in out
    assert sorted(rows) == sorted(f"smollm2+{m}@64.{k}" for m in ("none", "linear", "dynamic")
                                  for k in ("ppl.prose", "passkey"))
    assert sum(1 for c in calls if c is None) == 1  # none loaded once (calibration reused)
    for f in ("report.md", "ppl.csv", "buckets.csv", "passkey.csv", "timings.json",
              "ppl_by_position_smollm2.png", "passkey_smollm2.png"):
        assert os.path.getsize(os.path.join(workdir, f)) > 0, f
    none = rows["smollm2+none@64.ppl.prose"]
    assert [b[:2] for b in none["buckets"]] == [[0, 8], [8, 16], [16, 32], [32, 64]]
    assert sorted(none["prefix_ppl"]) == ["16", "32"]
    linear = rows["smollm2+linear@64.ppl.prose"]
    assert linear["factor"] == 2.0 and linear["ppl"] != none["ppl"]
    pk = rows["smollm2+linear@64.passkey"]
    assert pk["trials"] == 2 and len(pk["answers"]) == 2
    ppl = table.ppl_rows(rows.values())
    assert {(r["method"], r["length"]) for r in ppl if r["method"] == "none"} == {
        ("none", 16), ("none", 32), ("none", 64)}
    with open(os.path.join(workdir, "report.md")) as f:
        report = f.read()
    assert "| linear |" in report and "not yet measured" in report
    assert "Passkey was measured up to 64 tokens only" not in report  # it reached 2C
    section = readme.section(workdir, link="docs/extend")
    assert "| linear | 2 |" in section and "| none | 1 |" in section
    assert "![perplexity by position](docs/extend/ppl_by_position_smollm2.png)" in section
    assert "Not yet measured" in readme.section(str(tmp_path / "empty"))
    calls.clear()
    again = runner.run(config, workdir, load=tiny_load(calls), inspect=tiny_facts,
                      progress=False)
    assert again == rows and calls == []  # every result reused: nothing loaded


def test_sigterm_stops_after_the_job_and_a_rerun_continues(tmp_path, monkeypatch):
    config, workdir = tiny_config(tmp_path), str(tmp_path / "ext")
    config.methods = "none"  # two jobs: perplexity and passkey at 2C
    done = []
    real = dict(runner.RUNNERS)

    def first_then_term(kind):
        def run(ctx, job):
            row = real[kind](ctx, job)
            done.append(job.name)
            if len(done) == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return row
        return run

    monkeypatch.setattr(runner, "RUNNERS", {k: first_then_term(k) for k in real})
    with pytest.raises(SystemExit) as stop:
        runner.run(config, workdir, load=tiny_load(), inspect=tiny_facts, progress=False)
    assert stop.value.code == 0 and len(done) == 1
    assert os.listdir(os.path.join(workdir, "results")) == [f"{done[0]}.json"]
    assert signal.getsignal(signal.SIGTERM) is not None
    seen = []

    def counted(kind):
        def run(ctx, job):
            seen.append(job.name)
            return real[kind](ctx, job)
        return run

    monkeypatch.setattr(runner, "RUNNERS", {k: counted(k) for k in real})
    rows = runner.run(config, workdir, load=tiny_load(), inspect=tiny_facts, progress=False)
    assert done[0] not in seen and done[0] in rows and len(rows) == len(seen) + 1
