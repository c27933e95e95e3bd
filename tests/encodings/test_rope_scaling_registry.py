"""posenc_jax.encodings.rope_scaling's registry: one record per method, read by validation,
the frequency dispatch, the KV-cache regime, Hugging Face parsing and the study."""

import warnings

import numpy as np
import pytest

import posenc_jax
from posenc_jax.encodings import hf_config, rope_scaling
from posenc_jax.encodings.rope_scaling import registry, validation

BUILTIN = ("default", "linear", "ntk", "dynamic", "yarn", "longrope", "llama3", "proportional")
L0, D = 64, 16


def test_methods_and_aliases():
    assert rope_scaling.methods() == BUILTIN
    assert rope_scaling.methods(stretchable=True) == BUILTIN[1:-1]  # proportional: no stretch
    assert rope_scaling.method("su") is rope_scaling.method("longrope")
    with pytest.raises(ValueError, match=r"unknown rope_type='mrope'; valid: default, linear, "
                                         r"ntk, dynamic, yarn, longrope, llama3, proportional"):
        rope_scaling.method("mrope")
    with pytest.raises(ValueError, match=r"rope_type='default' does not extend the context; valid: linear, "):
        rope_scaling.stretch("default", factor=2.0, original_max_position_embeddings=L0,
                             rotary_dim=D)
    with pytest.raises(ValueError, match="'yarn' is already registered"):
        rope_scaling.register(rope_scaling.Method("yarn", rope_scaling.yarn))
    with pytest.raises(ValueError, match=r"required keys \['b'\] are not in its keys"):
        rope_scaling.register(rope_scaling.Method("new", rope_scaling.linear, required=("b",)))
    for name in BUILTIN:  # every record's keys have a check, and it requires what it takes
        record = rope_scaling.method(name)
        assert set(record.keys) <= set(validation.KEYS) and set(record.required) <= set(
            record.keys)


@pytest.mark.parametrize("name", BUILTIN[1:-1])
def test_stretch_at_factor_one_is_plain_rope_at_the_original_length(name):
    cfg = rope_scaling.stretch(name, factor=1.0, original_max_position_embeddings=L0,
                               rotary_dim=D)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the study's dicts deserve no warning
        valid = rope_scaling.validate(cfg, rotary_dim=D)
    assert valid["rope_type"] == name
    assert rope_scaling.is_length_dependent(valid) == (
        rope_scaling.method(name).length_dependent and name != "longrope")  # equal lists
    inv, factor = rope_scaling.frequencies(valid, rotary_dim=D, base=10000.0, seq_len=L0)
    plain, _ = rope_scaling.frequencies(None, rotary_dim=D, base=10000.0)
    np.testing.assert_allclose(np.asarray(inv), np.asarray(plain), rtol=1e-6)
    assert float(factor) == 1.0


def test_a_validated_dict_is_checked_once_on_every_path(monkeypatch):
    calls = []
    real = validation.resolve_type

    def counting(scaling):
        calls.append(scaling)
        return real(scaling)

    monkeypatch.setattr(validation, "resolve_type", counting)
    raw = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    valid = rope_scaling.validate(raw, rotary_dim=D)
    assert rope_scaling.validate(valid, rotary_dim=D) is valid and valid == {
        **raw, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
    enc = posenc_jax.get("rope", head_dim=D, scaling=raw)  # validated at construction
    enc.frequencies(None)
    enc.frequencies(100)
    assert len(calls) == 2
    config = {"head_dim": D, "max_position_embeddings": 128, "rope_scaling": raw}
    kwargs = hf_config.rope_kwargs_from_hf_config(config)
    hf_config.from_hf_config(config)  # the Hugging Face path: parse and validate once each
    posenc_jax.get("rope", **kwargs).frequencies(None)
    assert len(calls) == 4
    assert isinstance(kwargs["scaling"], rope_scaling.Validated)


def test_a_registered_method_is_validated_dispatched_and_rotated_by_its_record(monkeypatch):
    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    monkeypatch.setattr(registry, "_ALIASES", dict(registry._ALIASES))

    def toy(inv_freq, *, factor, seq_len=None):  # declared length-dependent, takes seq_len
        assert seq_len is not None
        return rope_scaling.linear(inv_freq, factor=factor)

    rope_scaling.register(rope_scaling.Method(
        "toy", toy, keys=("factor",), required=("factor",), aliases=("toy_alias",),
        length_dependent=True,
        stretch=lambda f, o, d: {"rope_type": "toy", "factor": f}))
    assert rope_scaling.methods(stretchable=True)[-1] == "toy"
    with pytest.raises(ValueError, match="rope_type='toy' requires the key 'factor'"):
        rope_scaling.validate({"type": "toy_alias"}, rotary_dim=D)
    with pytest.raises(TypeError, match="factor must be a number, got factor='2'"):
        rope_scaling.validate({"type": "toy", "factor": "2"}, rotary_dim=D)
    enc = posenc_jax.get("rope", head_dim=D, scaling={"type": "toy_alias", "factor": 2.0})
    assert enc.scaling_dict == {"rope_type": "toy", "factor": 2.0}
    assert enc.is_length_dependent
    inv, _ = enc.frequencies(10)
    plain, _ = rope_scaling.frequencies(None, rotary_dim=D, base=10000.0)
    np.testing.assert_allclose(np.asarray(inv), np.asarray(plain) / 2.0, rtol=1e-6)
    assert int(rope_scaling.regime(enc.scaling_dict, seq_len=10,
                                   max_position_embeddings=4)) == 10


def test_proportional_keeps_its_partial_rotary_factor_and_the_whole_head_dim():
    """proportional (p-RoPE, Gemma 4) reads partial_rotary_factor as the fraction of
    frequencies that rotate; the head dim still rotates whole. RoPE's generic reading of a
    partial_rotary_factor inside the scaling dict (the rotary fraction) must not apply to it:
    it refused rotary_dim=16 with factor 0.25 and broke Gemma 4 models from HF configs."""
    scaling = {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    enc = posenc_jax.get("rope", head_dim=16, rotary_dim=16, scaling=scaling)
    assert enc.rotary_dim == 16
    inv, _ = enc.frequencies()
    assert int(np.count_nonzero(np.asarray(inv))) == 2  # 0.25 * 16 / 2 rotating frequencies
