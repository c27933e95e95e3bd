"""The seed chapter's table on SmolLM2-135M at twice its context: 2C = 16,384 tokens.

    python -m train.extend --config=configs/extend_2c.py --workdir=runs/extend_2c
    python -m train.extend --config=configs/extend_2c.py:4C --workdir=runs/extend_4c

Every registry method with a stretch rule (linear, ntk, dynamic, yarn, llama3, longrope) and
`none`, at factor = length / C: perplexity by position bucket on the prose and the code text
(one causal forward per method and text at the longest length gives every bucket and, by its
prefixes, every shorter length), passkey at C and 2C (three depths, two keys). The estimate is
printed before the first job (calibrated on the machine that runs it); the command resumes
where it stopped. On 2 CPU cores this is hours, not the default's 30 minutes: each 16k
forward is 13.7 TFLOP (9.3 of them attention), and each passkey prompt at 2C is one more 16k
prefill per method (dynamic NTK: one more per generated token past C). What the committed run
in docs/extend/2c/ actually ran is in its report.md and in docs/extend.md.

`:4C` (the config file's argument) takes the lengths and passkey to 4C = 32,768: on a CPU the
estimate is printed and it is a day; `benchmarks/device_check.py`'s `extend_4c` section runs it
on an accelerator.
"""

from configs import extend_smollm2


def get_config(arg: str = "2C"):
    """`arg`: '2C' (the default) or '4C', the longest length."""
    if arg not in ("2C", "4C"):
        raise ValueError(f"configs/extend_2c.py:{arg}: the argument must be 2C or 4C")
    config = extend_smollm2.get_config()
    config.methods = "all"
    config.lengths = "C/4,C/2,C,2C" + (",4C" if arg == "4C" else "")
    config.texts = "prose,code"
    config.passkey.update(lengths="C,2C" + (",4C" if arg == "4C" else ""),
                          depths="0.1,0.5,0.9", keys_per_depth=2)
    config.attention = "auto"
    config.calibrate_len = 2048
    return config
