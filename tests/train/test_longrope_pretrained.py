"""LongRoPE's search on a pretrained checkpoint (the tiny Llama): the fitness runs the model
`pretrained.load` builds from the exported dict, the export round-trips, a start count runs
here and is refused by export, and the command's CPU smoke."""

import dataclasses
import io
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax import pretrained
from posenc_jax.model.config import TransformerConfig, thaw
from posenc_jax.model.transformer import Transformer
from train.longrope import cli, export
from train.longrope import fitness as fitness_lib
from train.longrope.fitness import Perplexity, windows
from train.longrope.short import ShortFactors
from train.longrope.space import Candidate

TINY = os.path.join(os.path.dirname(__file__), "..", "data", "pretrained", "tiny", "llama")
README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
TARGET = 128  # 2x the tiny model's max_position_embeddings=64


@nnx.jit
def forward(model, tokens):
    """Logits as one compiled program per model structure (not op by op)."""
    return model(tokens)


@pytest.fixture(scope="module")
def fit():
    return Perplexity.load(TINY, target_length=TARGET, text=README, samples=1)


def test_space_and_seeds_come_from_the_checkpoint(fit):
    assert (fit.pairs, fit.original, fit.scale, fit.base) == (4, 64, 2.0, 10000.0)
    space = fit.space(starts=(0,))
    # PI; NTK 2^(i/3); YaRN: ramp over correction dims [0, 2] (d=8, base 1e4, L0=64), so
    # inv_freq * (keep + (1 - keep) / 2) with keep = 1, 1/2, 0, 0 -> factors 1, 4/3, 2, 2
    assert [s.factors(space.step) for s in fit.seeds(space)] == [
        (2.0,) * 4, (1.0, 1.26, 1.59, 2.0), (1.0, 1.33, 2.0, 2.0)]


def test_fitness_model_is_the_model_pretrained_load_builds_from_the_export(fit, tmp_path):
    space = fit.space(starts=(0,))
    best = Candidate((100, 130, 170, 240), 0)
    scaling = export.rope_scaling(best, step=space.step, target_length=TARGET,
                                  original_max_position_embeddings=64)
    assert scaling == {"rope_type": "longrope", "long_factor": [1.0, 1.3, 1.7, 2.4],
                       "short_factor": [1.0] * 4, "original_max_position_embeddings": 64,
                       "factor": 2.0}
    tokens = jnp.asarray(fit.tokens)
    ours = np.asarray(forward(fit.model(best), tokens))
    lm = pretrained.load(TINY, rope_scaling=scaling)
    assert fit.config(best).layer_encoding(0) == lm.config.layer_encoding(0)
    assert fit.config(best).scan_layers and not lm.config.scan_layers  # the fitness scans
    loaded = np.asarray(forward(lm.model, tokens))
    np.testing.assert_allclose(loaded, ours, atol=1e-5, rtol=1e-5)
    pretrained.save(lm, tmp_path / "export")                  # out to a transformers dir ...
    written = json.loads((tmp_path / "export" / "config.json").read_text())
    rope = written.get("rope_parameters") or written["rope_scaling"]
    assert rope["rope_type"] == "longrope" and rope["long_factor"] == [1.0, 1.3, 1.7, 2.4]
    back = pretrained.load(tmp_path / "export")                 # ... and back in
    np.testing.assert_array_equal(np.asarray(forward(back.model, tokens)), loaded)
    logits = ours[0, :-1].astype(np.float64)                    # float64 reference loss
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -np.mean(np.take_along_axis(logp, fit.tokens[0, 1:, None].astype(np.int64), -1))
    assert fit(best) == pytest.approx(np.exp(nll), rel=1e-4)


def test_runtime_factors_give_the_static_models_nll_and_compile_once(fit):
    """Every candidate (factors, start 0 and > 0) runs through ONE compiled `window_nll`, and
    gives the NLL of the static model that `config(candidate)` describes (float32)."""
    tokens = jnp.asarray(fit.tokens)
    graphdef, _ = fit.program
    checked = [Candidate((100, 130, 170, 240), 0), Candidate((150, 150, 200, 250), 8)]
    fit.nll(Candidate((200,) * 4, 0))
    compiled = fitness_lib.window_nll._cache_size()
    for cand in checked:
        static_graph, empty, state = nnx.split(fit.model(cand), fitness_lib._is_table, ...)
        assert len(jax.tree.leaves(empty)) == 0  # the static model has no tables
        want = float(fitness_lib.window_nll(state, empty, tokens, graphdef=static_graph,
                                            chunk=fit.chunk)) / (TARGET - 1)
        assert fit.nll(cand) == pytest.approx(want, rel=2e-6, abs=0)
    again = Perplexity.load(TINY, target_length=TARGET, text=README, samples=1)
    assert again.program[0] == graphdef  # another search at this shape: the same program
    again.nll(Candidate((110, 120, 130, 140), 2))
    # the static models compiled once each; the runtime path never again
    assert fitness_lib.window_nll._cache_size() == compiled + len(checked)


def test_short_factor_fitness_runs_the_short_regime_with_the_long_factors_kept(fit):
    """The second search: windows of the original 64 tokens, the candidate as short_factor,
    the long candidate's long_factor and start in the dict; one compile for its candidates."""
    long = Candidate((100, 130, 170, 240), 2)
    short = ShortFactors.after(fit, long)
    assert short.tokens.shape == (2, 64) and short.scale == 2.0
    np.testing.assert_array_equal(short.tokens.reshape(-1), fit.tokens.reshape(-1))
    space = short.space()
    ones, longs = short.seeds(space)
    assert space.starts == (0,) and longs.steps == long.steps and set(ones.steps) == {100}
    cand = Candidate((100, 110, 120, 150), 0)
    assert short.scaling(cand) == {**fit.scaling(long), "short_factor": [1.0, 1.1, 1.2, 1.5]}
    assert short.config(cand).layer_encoding(0).unscaled_start == 2
    tokens = jnp.asarray(short.tokens)
    logits = np.asarray(forward(short.model(ones), tokens), np.float64)[:, :-1]  # the static model
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -np.mean(np.take_along_axis(logp, short.tokens[:, 1:, None].astype(np.int64), -1))
    assert short(ones) == pytest.approx(np.exp(nll), rel=1e-4)
    compiled = fitness_lib.window_nll._cache_size()
    assert short(cand) != short(ones) and fitness_lib.window_nll._cache_size() == compiled
    with pytest.raises(ValueError, match="short_factor windows of 128 tokens must be at most"):
        ShortFactors(fit.source, fit.tokens, original=64, extended=128, long=long,
                     rebuild=fit.rebuild)


def test_a_start_count_runs_here_and_export_refuses_it(fit, tmp_path):
    space = fit.space()
    with_start = Candidate((100, 130, 170, 240), 8)
    without = Candidate((100, 130, 170, 240), 0)
    a, b = fit(with_start), fit(without)
    assert np.isfinite(a) and a != b
    with pytest.raises(ValueError, match="cannot export start=8 as a Hugging Face rope_scaling: "
                                         "transformers' longrope .* has no key for the first 8 "
                                         "positions"):
        export.rope_scaling(with_start, step=space.step, target_length=TARGET,
                            original_max_position_embeddings=64)
    model = fit.model(with_start)
    with pytest.raises(ValueError, match="cannot export this model as a transformers checkpoint:"
                                         " .*unscaled_start=8 .*has no transformers "
                                         "rope_parameters key"):
        pretrained.save(model, tmp_path / "refused")
    assert not (tmp_path / "refused" / "config.json").exists()


def test_short_text_and_short_target_are_refused(fit):
    with pytest.raises(ValueError, match="the text has 10 tokens; 2 window.s. of target_length="
                                         "8 need 16"):
        windows(np.arange(10), target_length=8, samples=2)
    with pytest.raises(ValueError, match="target_length=64 must exceed .*llama's original "
                                         "context max_position_embeddings=64"):
        Perplexity.pretrained(pretrained.load(TINY), fit.tokens[:, :64], where=TINY)


@pytest.mark.parametrize("layers", [None, ["rope", "nope"]])
def test_a_model_of_ours_takes_the_candidate_at_every_rope_layer(layers):
    config = TransformerConfig(vocab_size=64, num_layers=2, embed_dim=32, num_heads=2,
                               mlp_dim=64, encoding="nope" if layers else "rope",
                               layer_encodings=layers)
    model = Transformer(config, rngs=nnx.Rngs(0))
    tokens = np.random.default_rng(0).integers(0, 64, (2, 48)).astype(np.int32)
    fit = Perplexity.of_model(model, tokens, original=16)
    assert (fit.pairs, fit.scale) == (8, 3.0)
    cand = fit.seeds(fit.space())[1]
    cfg = fit.config(cand)
    assert tuple(cfg.layer_encoding(0).scaling_dict["long_factor"]) == cand.factors(0.01)
    assert cfg.layer_encoding(1).name == ("nope" if layers else "rope")
    scaled = dataclasses.replace(config, **(
        {"layer_encodings": [("rope", {"scaling": fit.scaling(cand)}), "nope"]} if layers
        else {"encoding_kwargs": {"scaling": fit.scaling(cand)}}))
    want = forward(Transformer(scaled, rngs=nnx.Rngs(0)), jnp.asarray(tokens))
    np.testing.assert_allclose(forward(fit.model(cand), jnp.asarray(tokens)), want, atol=1e-5)
    assert np.isfinite(fit(cand)) and fit(cand) != fit(Candidate((100,) * 8, 0))
    coarse = Perplexity.of_model(model, tokens, original=16, step=0.1)  # the grid travels
    space = coarse.space()
    assert space.step == 0.1 and (space.low, space.high) == (10, 37)
    assert coarse.scaling(Candidate((10,) * 7 + (37,), 0))["long_factor"] == [1.0] * 7 + [3.7]


def test_command_smoke(tmp_path):
    argv = [f"--checkpoint={TINY}", f"--target_length={TARGET}", f"--text={README}",
            f"--workdir={tmp_path}", "--generations=1", "--population=3", "--parents=2",
            "--mutations=1", "--crossovers=0", "--starts=0"]
    out = io.StringIO()
    summary = cli.run(cli.parser().parse_args(argv), out=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("longrope search: R=4 pairs, scale 2 (64 -> 128), 1 window(s); "
                               "estimate: 4 evaluations x ")
    assert lines[1].startswith("generation 0: best ppl ") and lines[2].startswith("generation 1")
    scaling = json.loads((tmp_path / "rope_scaling.json").read_text())
    assert scaling == summary["rope_scaling"] and summary["unscaled_start"] == 0
    assert summary["perplexity"] <= min(summary["seeds"].values())
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 2
    lm = pretrained.load(TINY, rope_scaling=scaling)
    assert list(lm.config.layer_encoding(0).scaling_dict["long_factor"]) == (
        scaling["long_factor"])


def test_gemma3_searches_its_full_attention_layers_only():
    gemma = os.path.join(os.path.dirname(TINY), "gemma3_text")
    lm = pretrained.load(gemma)
    tokens = np.random.default_rng(1).integers(0, 200, (1, 96)).astype(np.int32)
    fit = Perplexity.pretrained(lm, tokens, where=gemma)
    cand = Candidate((100, 110, 130, 150, 150, 160, 170, 180), 2)
    assert (fit.pairs, fit.base, fit.original) == (8, 1e6, 64)
    cfg = fit.config(cand)
    kinds = {(e.scaling is not None, e.unscaled_start, e.base) for e in map(
        cfg.layer_encoding, range(cfg.num_layers))}
    assert kinds == {(False, 0, 1e4), (True, 2, 1e6)}  # sliding layers untouched
    want = pretrained.load(gemma, rope_scaling=fit.scaling(cand)).model
    assert not cfg.scan_layers  # one encoding per layer type: the loop
    zero = Candidate(cand.steps, 0)
    np.testing.assert_array_equal(forward(fit.model(zero), jnp.asarray(tokens)),
                                  forward(want, jnp.asarray(tokens)))
    assert np.isfinite(fit(cand)) and fit(cand) != fit(zero)


def test_command_searches_short_factor_after_the_long_one(tmp_path):
    argv = [f"--checkpoint={TINY}", f"--target_length={TARGET}", f"--text={README}",
            f"--workdir={tmp_path}", "--generations=1", "--population=2", "--parents=1",
            "--mutations=1", "--crossovers=0", "--starts=0", "--short_factor"]
    out = io.StringIO()
    summary = cli.run(cli.parser().parse_args(argv), out=out)
    assert "short_factor search: 2 window(s) of 64" in out.getvalue()
    scaling = json.loads((tmp_path / "rope_scaling.json").read_text())
    assert scaling == summary["rope_scaling"] and len(scaling["short_factor"]) == 4
    assert summary["short_perplexity"] <= min(summary["short_seeds"].values())
    assert (tmp_path / "short" / "log.jsonl").exists()
    lm = pretrained.load(TINY, rope_scaling=scaling)
    assert list(lm.config.layer_encoding(0).scaling_dict["short_factor"]) == (
        scaling["short_factor"])


def test_command_with_a_start_count_writes_no_rope_scaling_and_says_why(tmp_path):
    argv = [f"--checkpoint={TINY}", f"--target_length={TARGET}", f"--text={README}",
            f"--workdir={tmp_path}", "--generations=0", "--population=1", "--parents=1",
            "--starts=4"]
    out = io.StringIO()
    summary = cli.run(cli.parser().parse_args(argv), out=out)
    assert summary["unscaled_start"] == 4 and (tmp_path / "result.json").exists()
    assert not (tmp_path / "rope_scaling.json").exists()
    assert "no rope_scaling.json: cannot export start=4 as a Hugging Face rope_scaling" in (
        out.getvalue())
    with pytest.raises(ValueError, match="--starts must be a comma list of ints, got "
                                         "--starts='0,x'"):
        cli.run(cli.parser().parse_args([*argv[:-1], "--starts=0,x"]))


def test_export_scales_the_rope_entries_of_a_layer_pattern():
    """Llama 4's spelling (a pattern naming a NoPE layer): the RoPE layers take the dict and
    the start count, the NoPE layer and the chunks stay as they are."""
    cfg = TransformerConfig(vocab_size=32, num_layers=4, embed_dim=16, num_heads=2, mlp_dim=32,
                            attn_temperature={"floor_scale": 8, "attn_scale": 0.1},
                            layer_pattern=[{"chunk": 8},
                                           {"encoding": "nope", "temperature": True}])
    scaling = {"rope_type": "linear", "factor": 2.0}
    out = export.with_start(export.with_scaling(cfg, scaling), 4)
    specs = out.layer_specs
    assert [s.encoding[0] for s in specs] == ["rope", "nope"] * 2
    assert [s.chunk for s in specs] == [8, None] * 2
    for i in (0, 2):
        kwargs = thaw(out.layer_encodings[i][1])
        assert kwargs == {"scaling": scaling, "unscaled_start": 4}
        assert out.layer_encoding(i).unscaled_start == 4
    assert out.layer_encoding(1) == cfg.layer_encoding(1)  # NoPE: untouched
    assert export.with_scaling(cfg, scaling).layer_encoding(0) != cfg.layer_encoding(0)
