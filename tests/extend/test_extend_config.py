"""Every setting of the extension study checked before its first job (issue 34): one row per
hostile value, the exact message, nothing loaded and no file made; C and the rotary dim read
from the checkpoint."""

import os
import pathlib
import subprocess
import sys

import pytest

from configs import extend_smollm2
from train.extend import runner, settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "pretrained" / "tiny"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2(path):
    """SmolLM2-135M's header facts, without its file."""
    return settings.Facts(context=8192, rotary_dim=64)


def forbidden(*args, **kwargs):
    raise AssertionError("a model was loaded before the config was checked")


@pytest.mark.parametrize("key, value, error, message", [
    ("tolerance", -1.0, ValueError, r"config.tolerance must be > 0.0, got config.tolerance=-1.0"),
    ("passkey_threshold", 2.0, ValueError,
     r"config.passkey_threshold must be <= 1.0, got config.passkey_threshold=2.0"),
    ("passkey.keys_per_depth", 0, ValueError,
     r"config.passkey.keys_per_depth must be >= 1, got config.passkey.keys_per_depth=0"),
    ("passkey.digits", 0, ValueError,
     r"config.passkey.digits must be >= 1, got config.passkey.digits=0"),
    ("passkey.depths", "0.5,2", ValueError,
     r"config.passkey.depths must be <= 1.0, got config.passkey.depths=2.0"),
    ("passkey.depths", "middle", ValueError,
     r"config.passkey.depths='middle': 'middle' is not a number in \[0, 1\]"),
    ("calibrate_len", 0, ValueError,
     r"config.calibrate_len must be >= 1, got config.calibrate_len=0"),
    ("lengths", "", ValueError, r"config.lengths='' names no length"),
    ("lengths", "C/0", ValueError, r"length 'C/0' in config.lengths divides by zero"),
    ("lengths", "C,3X", ValueError, (r"length '3X' must be an int or 'C', '2C', 'C/4' in "
                                    r"config.lengths")),
    ("lengths", "C/3", ValueError,
     r"length 'C/3' is not a whole number of tokens for C=8192 in config.lengths"),
    ("model.smollm2.rotary_dim", 7, ValueError,
     (rf"config.model.smollm2.rotary_dim=7 contradicts the checkpoint: \S*{FILE} holds a rotary "
     r"dim=64; leave it 0 to read it from the checkpoint")),
    ("model.smollm2.context", 4096, ValueError,
     (rf"config.model.smollm2.context=4096 contradicts the checkpoint: \S*{FILE} holds "
     r"max_position_embeddings=8192; leave it 0")),
    ("methods", "none,none", ValueError, r"config.methods='none,none' names an entry twice"),
    ("dtype", "float16", ValueError, (r"unknown config.dtype 'float16'; valid: 'float32', "
                                     r"'bfloat16'")),
    ("attention", "flash", ValueError, r"unknown config.attention 'flash'; valid: "),
    ("scaling_overrides.pi", {"factor": 2.0}, ValueError,
     r"unknown config.scaling_overrides method 'pi'; valid: 'linear'"),
    ("model.smollm2.file", "", ValueError, (r"config.model.smollm2.file is empty: name the "
                                           r"checkpoint")),
    ("models", "smollm2,llama", ValueError,
     (r"config.models='smollm2,llama': unknown \['llama'\] \(unknown model 'llama'; valid: "
     r"'gemma3', 'smollm2'\)")),
    ("foo", 1, ValueError, (r"config.foo: the extension study has no such key \(config's keys: "
                           r"models, model, pretrained_dir")),
    ("passkey.depth", "0.5", ValueError, (r"config.passkey.depth: the extension study has no "
                                         r"such key \(config.passkey's keys: enabled, lengths, "
                                         r"depths")),
])
def test_each_bad_setting_is_refused_before_any_job(tmp_path, key, value, error, message):
    config = extend_smollm2.get_config()
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        node = node[part]
    with node.unlocked():
        node[leaf] = value
    with pytest.raises(error, match=f"^{message}"):
        runner.run(config, str(tmp_path), load=forbidden, inspect=smollm2, progress=False)
    assert not os.listdir(tmp_path)


def test_a_missing_checkpoint_names_the_model_and_the_fix(tmp_path):
    config = extend_smollm2.get_config()
    config.pretrained_dir = str(tmp_path / "none")
    with pytest.raises(ValueError, match=rf"^model 'smollm2': {tmp_path}/none/{FILE} does not "
                                         r"exist \(bash scripts/fetch_pretrained.sh DIR"):
        runner.run(config, str(tmp_path / "w"), load=forbidden, progress=False)


def test_context_and_rotary_dim_come_from_the_checkpoint():
    assert settings.checkpoint_facts(str(TINY / "llama")) == settings.Facts(context=64,
                                                                          rotary_dim=8)
    config = extend_smollm2.get_config()
    config.model.smollm2.file = "llama"
    config.pretrained_dir = str(TINY)
    config.lengths = config.passkey.lengths = "C/2,C,2C"
    s = settings.read(config)
    assert (s.models[0].context, s.models[0].rotary_dim, s.models[0].lengths) == (
        64, 8, (32, 64, 128))


def test_the_cli_names_an_unknown_key_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "train.extend", "--config=configs/extend_smollm2.py",
         f"--workdir={tmp_path}", "--config.foo=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "XLA_FLAGS": ""})
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith(
        "error: --config.foo: config has no key 'foo'")
    assert "Traceback" not in out.stderr and not os.listdir(tmp_path)


def test_the_2c_and_4c_configs_read_and_accept_auto_attention():
    """configs/extend_2c.py (the 2C table; `:4C` one flag away) names every stretch method, both
    texts, three depths x two keys; 'auto' attention is accepted (configs/extend_full.py's)."""
    from configs import extend_2c, extend_full
    for arg, longest in (("2C", 128), ("4C", 256)):
        config = extend_2c.get_config(arg)
        config.model.smollm2.file = "llama"
        config.pretrained_dir = str(TINY)
        s = settings.read(config)
        assert s.attention == "auto" and s.models[0].lengths[-1] == longest
        assert set(s.methods) == {"none", "linear", "ntk", "dynamic", "yarn", "llama3",
                                  "longrope"} and s.texts == ("prose", "code")
    with pytest.raises(ValueError, match=r"configs/extend_2c.py:3C: the argument must be 2C or 4C"):
        extend_2c.get_config("3C")
    assert extend_full.get_config().attention == "auto"
