"""train.extend on a real checkpoint: the tiny random Llama of tests/data/pretrained/tiny/llama
(C = 64, untied output head, its own BPE tokenizer.json) read by `posenc_jax.pretrained.load`,
the loader `python -m train.extend` passes to the runner."""

import os
import pathlib

from configs import extend_smollm2
from posenc_jax import pretrained
from train.extend import runner

TINY = pathlib.Path(__file__).resolve().parents[1] / "data" / "pretrained" / "tiny"


def test_the_study_on_a_tiny_real_checkpoint(tmp_path):
    config = extend_smollm2.get_config()
    config.model.smollm2.update(file="llama", context=64, rotary_dim=8, add_bos=True)
    config.pretrained_dir = str(TINY)
    config.methods = "none,yarn,longrope"
    config.lengths = "C/2,C,2C"
    config.passkey.update(lengths="4C", depths="0.5", max_new_tokens=6)
    config.calibrate_len = 32
    config.calibrate_attention_len = 64
    rows = runner.run(config, str(tmp_path / "ext"), load=pretrained.load, progress=False)
    assert sorted(rows) == sorted(f"smollm2+{m}@{k}" for m in ("none", "yarn", "longrope")
                                  for k in ("128.ppl.prose", "256.passkey"))
    yarn, none = rows["smollm2+yarn@128.ppl.prose"], rows["smollm2+none@128.ppl.prose"]
    assert yarn["factor"] == 2.0 and yarn["tokens"] == 128 and yarn["ppl"] != none["ppl"]
    assert rows["smollm2+longrope@256.passkey"]["trials"] == 1
    assert os.path.getsize(tmp_path / "ext" / "report.md") > 0
