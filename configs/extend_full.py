"""The context-extension study for an accelerator: SmolLM2-135M (C = 8192) and Gemma 3 270M
(C = 32768), every method at C/4 .. 4C, prose and code, five passkey depths x two keys.

    python -m train.extend --config=configs/extend_full.py --workdir=runs/ext_full

Gemma 3's 4C is 131072 tokens: with a vocabulary of 262144 the passkey prefill's logits alone
are 137 GB in float32 (`posenc_jax.model.generate` computes them for the whole prompt), so its
passkey stops at 2C; perplexity takes the loss in chunks and goes to 4C.
"""


from configs import extend_smollm2


def get_config():
    config = extend_smollm2.get_config()
    config.models = "smollm2,gemma3"
    config.lengths = "C/4,C/2,C,2C,4C"
    config.methods = "all"
    config.texts = "prose,code"
    config.passkey.update(lengths="", depths="0,0.25,0.5,0.75,1", keys_per_depth=2)
    config.model.gemma3.passkey_lengths = "C/4,C/2,C,2C"
    config.attention = "auto"
    config.calibrate_len = 2048
    return config
