"""train.extend's pure parts against hand-computed values: position buckets, the passkey
prompt, the answer check, the texts, the plan and the time estimate."""

import math
import types

import numpy as np
import pytest

from configs import extend_smollm2
from posenc_jax.model.config import TransformerConfig
from train.extend import estimate, measure, plan, prompts, texts
from train.extend.settings import Facts


def smollm2(path):
    """SmolLM2-135M's header facts (C = 8192, rotary dim 64), without its file."""
    return Facts(context=8192, rotary_dim=64)


class Words:
    """A tokenizer with one id per whitespace-separated word (ids in order of first sight)."""

    bos_id = 0

    def __init__(self):
        self.vocab = {}

    def encode(self, text):
        return [self.vocab.setdefault(w, len(self.vocab) + 1) for w in text.split()]


def test_bucket_edges_by_hand():
    assert measure.bucket_edges(8192, 16384) == [(0, 2048), (2048, 4096), (4096, 8192),
                                                 (8192, 16384)]
    assert measure.bucket_edges(8192, 6000) == [(0, 2048), (2048, 4096), (4096, 6000)]
    assert measure.bucket_edges(8, 32) == [(0, 2), (2, 4), (4, 8), (8, 16), (16, 32)]


def test_bucket_perplexity_by_hand():
    nll = [1.0, 3.0, 2.0, 2.0, 0.0, 0.0, 0.0, 4.0, 1.0, 1.0]
    got = measure.bucket_perplexity(nll, context=8)
    assert [(a, b) for a, b, _ in got] == [(0, 2), (2, 4), (4, 8), (8, 10)]
    np.testing.assert_allclose([p for _, _, p in got],
                               [math.exp(2.0), math.exp(2.0), math.exp(1.0), math.exp(1.0)])
    assert measure.perplexity(nll) == pytest.approx(math.exp(1.4))


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_passkey_prompt_has_the_exact_length_and_the_key_at_its_depth(depth):
    tok = Words()
    p = prompts.passkey_prompt(tok.encode, length=120, depth=depth, key="31415", prefix=[0])
    assert len(p.ids) == 120
    task, key_line = len(tok.encode(prompts.TASK)), tok.encode(prompts.KEY_LINE.format(
        key="31415"))
    question = tok.encode(prompts.QUESTION)
    room = 120 - 1 - task - len(key_line) - len(question)
    assert p.key_offset == 1 + task + round(depth * room)
    assert list(p.ids[p.key_offset:p.key_offset + len(key_line)]) == key_line
    assert list(p.ids[-len(question):]) == question and p.ids[0] == 0
    filler = tok.encode(prompts.FILLER)
    assert list(p.ids[1 + task:1 + task + min(len(filler), p.key_offset - 1 - task)]) == \
        filler[:p.key_offset - 1 - task]


def test_passkey_prompt_refuses_too_short_and_bad_depth():
    with pytest.raises(ValueError, match=r"length=10 is too short for the passkey prompt"):
        prompts.passkey_prompt(Words().encode, length=10, depth=0.5, key="12345")
    with pytest.raises(ValueError, match=r"depth must be in \[0, 1\], got depth=1.5"):
        prompts.passkey_prompt(Words().encode, length=100, depth=1.5, key="12345")


def test_answer_matches_is_exact():
    assert prompts.answer_matches(" 31415. Remember", "31415")
    assert prompts.answer_matches("31415", "31415")
    for wrong in (" 3141", " 314150", "The key is 31415", ""):
        assert not prompts.answer_matches(wrong, "31415")
    keys = prompts.make_keys(5, digits=5, seed=3)
    assert keys == prompts.make_keys(5, digits=5, seed=3)
    assert all(len(k) == 5 and k[0] != "0" for k in keys)


def test_texts_come_from_this_python():
    prose = texts.source_text("prose")
    assert len(prose) > 300_000 and "The \"assert\" statement" in prose[:200]
    assert "class Decimal" in texts.source_text("code")
    ids = texts.document_ids(Words(), "prose", 500, add_bos=True)
    assert len(ids) == 500 and ids[0] == 0
    with pytest.raises(ValueError, match=r"unknown text 'poetry'; valid: prose, code"):
        texts.source_text("poetry")


class AddsBos(Words):
    """A tokenizer whose encode puts BOS in front by itself (as Gemma's does)."""

    def encode(self, text):
        return [0] + super().encode(text)


def test_pieces_never_carry_a_bos_of_their_own():
    tok = AddsBos()
    assert texts.plain_ids(tok, "a b") == [1, 2]
    assert texts.encode(tok, "a b", add_bos=False) == [1, 2]
    assert texts.encode(tok, "a b", add_bos=True) == [0, 1, 2]


def test_the_default_plan():
    p = plan.make_plan(extend_smollm2.get_config(), "/tmp/x", inspect=smollm2)
    assert p.methods == ("none", "linear", "ntk", "dynamic", "yarn")
    assert set(p.methods) <= set(plan.all_methods())
    assert p.lengths["smollm2"] == (2048, 4096, 8192, 10240)
    ppl = p.of_kind("ppl")
    none = [j for j in ppl if j.method == "none"]
    assert [(j.length, j.prefixes, j.factor) for j in none] == [(10240, (2048, 4096, 8192),
                                                                  1.0)]
    scaled = [j for j in ppl if j.method != "none"]
    assert {(j.method, j.length, j.factor) for j in scaled} == {
        (m, 10240, 1.25) for m in ("linear", "ntk", "dynamic", "yarn")}
    for j in scaled:
        sc = j.rope_scaling
        assert sc["factor"] == 1.25 and sc.get("rope_type", j.method) == j.method
    pk = p.of_kind("passkey")  # within C every method is the unscaled model: none only
    assert sorted((j.method, j.length) for j in pk) == [("none", 2048), ("none", 4096),
                                                         ("none", 8192)]
    assert all(j.trials == 1 and j.depths == (0.5,) for j in pk)
    assert len({j.name for j in p.jobs}) == len(p.jobs)


def test_passkey_past_c_is_one_override_away():
    config = extend_smollm2.get_config()
    config.lengths = config.passkey.lengths = "C/4,C/2,C,2C"  # the 16k
    pk = plan.make_plan(config, "/tmp/x", inspect=smollm2).of_kind("passkey")
    assert sorted((j.method, j.length) for j in pk if j.length > 8192) == [
        (m, 16384) for m in ("dynamic", "linear", "none", "ntk", "yarn")]


def test_plan_errors_name_the_key():
    config = extend_smollm2.get_config()
    config.methods = "none,pi"
    with pytest.raises(ValueError, match=r"config.methods='none,pi': unknown \['pi'\]"):
        plan.make_plan(config, "/tmp/x", inspect=smollm2)
    config = extend_smollm2.get_config()
    config.lengths = "C,3X"
    with pytest.raises(ValueError, match=r"length '3X' must be an int or 'C'"):
        plan.make_plan(config, "/tmp/x", inspect=smollm2)


MC = TransformerConfig(vocab_size=100, num_layers=2, embed_dim=8, num_heads=2, num_kv_heads=1,
                       head_dim=4, mlp_dim=16)


def test_forward_flops_by_hand():
    # per token: 2 * (2 layers * (2*8*2*4 + 2*8*1*4 + 3*8*16) + 8*100) = 2 * (2*576 + 800)
    n = 10
    attention = 2.0 * 2 * 2 * 4 * n * n
    assert estimate.forward_flops(MC, n) == n * 2 * (2 * 576 + 800) + attention


def test_the_estimate_adds_rebuilds_for_length_dependent_scalings():
    cost = estimate.Cost.calibrate(MC, forward_seconds=2.0, length=10, compile_s=1.0,
                                   load_s=5.0)
    assert cost.flops_per_s == estimate.forward_flops(MC, 10) / 2.0
    config = extend_smollm2.get_config()
    config.lengths = config.passkey.lengths = "2C"
    jobs = plan.make_plan(config, "/tmp/x", inspect=smollm2).jobs
    ppl = next(j for j in jobs if j.kind == "ppl" and j.method == "linear")
    assert cost.seconds(ppl) == pytest.approx(
        estimate.forward_flops(MC, 16384) / cost.flops_per_s + 1.0 + 5.0)
    steady = next(j for j in jobs if j.kind == "passkey" and j.method == "linear")
    grows = next(j for j in jobs if j.kind == "passkey" and j.length_dependent)
    extra = grows.trials * (grows.max_new_tokens - 1) * estimate.forward_flops(MC, 16384)
    assert cost.flops(grows) - cost.flops(steady) == pytest.approx(extra)
    assert cost.seconds(grows) - cost.seconds(steady) == pytest.approx(
        extra / cost.flops_per_s)
    assert cost.seconds(steady, loads=False) == pytest.approx(
        cost.flops(steady) / cost.flops_per_s + estimate.GENERATE_COMPILES * 1.0)
    same = [ppl, steady]  # one scaling dict: one load
    assert estimate.total_seconds(cost, same) == pytest.approx(
        cost.seconds(ppl) + cost.seconds(steady, loads=False))
    with pytest.raises(TypeError, match="no cost for a job of kind"):
        cost.flops(types.SimpleNamespace(kind="train", length=8))


def test_attention_gets_its_own_rate():
    # a 10-token forward took 2 s; one layer's attention over 20 tokens alone took 0.5 s
    attn_rate = 2.0 * 1 * 2 * 4 * 20 * 20 / 0.5
    cost = estimate.Cost.calibrate(MC, forward_seconds=2.0, length=10, compile_s=1.0,
                                   load_s=5.0, attention_seconds=0.5, attention_length=20)
    assert cost.attention_flops_per_s == pytest.approx(attn_rate)
    rest = 2.0 - estimate.attention_flops(MC, 10) / attn_rate
    assert cost.flops_per_s == pytest.approx(estimate.linear_flops(MC, 10) / rest)
    assert cost.forward_seconds(10) == pytest.approx(2.0)  # it reproduces its calibration
    assert cost.forward_seconds(1000) == pytest.approx(
        estimate.linear_flops(MC, 1000) / cost.flops_per_s
        + estimate.attention_flops(MC, 1000) / attn_rate)
    slow = estimate.Cost.calibrate(MC, forward_seconds=2.0, length=10, compile_s=0.0,
                                   load_s=0.0, attention_seconds=1e6, attention_length=2)
    assert slow.flops_per_s == pytest.approx(estimate.linear_flops(MC, 10) / 1.0)  # half kept
