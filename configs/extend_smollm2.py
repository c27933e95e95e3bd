"""The context-extension study on this machine's CPU (`python -m train.extend`): SmolLM2-135M
(context C = 8192) zero-shot with every RoPE scaling method at 2k, 4k, 8k and 16k.

Keys:
  models            comma-separated names of config.model entries
  model.<name>      file (under pretrained_dir), context C, rotary_dim (the RoPE dims, for
                    LongRoPE's factor lists), add_bos (prepend the tokenizer's BOS),
                    passkey_lengths ('' = passkey.lengths)
  pretrained_dir    '' -> $POSENC_PRETRAINED_DIR, else <repo>/.pretrained
                    (bash scripts/fetch_pretrained.sh DIR puts the files there)
  methods           'all' (none + every registry method with a stretch rule) or a list
  lengths           ints or multiples of C ('C/4', 'C', '2C'); a method runs at n > C with
                    factor n / C
  texts             'prose' (pydoc_data/topics.py), 'code' (long stdlib modules)
  passkey           enabled, lengths ('' = lengths), depths, keys_per_depth, digits, seed,
                    max_new_tokens
  tolerance         the supported-length criterion: perplexity <= (1 + tolerance) x the
                    model's own at C; passkey_threshold: accuracy >= this
  dtype, attention, block_size   how the model runs ('' attention: as loaded; 'auto' is
                    blockwise past 2048 on a CPU, the kernel on an accelerator)
  calibrate_len     tokens of the forward that calibrates the time estimate
  scaling_overrides <method>: keys replacing the method's stretch rule

On 2 shared CPU cores a 16k forward of SmolLM2 costs minutes (about 14 TFLOP: the attention's
L^2 term is two thirds of it), so this default measures the prose text only and three passkey
prompts per length; the estimate printed before the first job says what it will cost here.
"""

import ml_collections


def smollm2():
    return ml_collections.ConfigDict({"file": "SmolLM2-135M-Instruct.Q4_1.gguf",
                                      "context": 8192, "rotary_dim": 64, "add_bos": False,
                                      "passkey_lengths": ""})


def gemma3():
    return ml_collections.ConfigDict({"file": "gemma-3-270m-q4_k_m.gguf", "context": 32768,
                                      "rotary_dim": 256, "add_bos": True,
                                      "passkey_lengths": ""})


def get_config():
    config = ml_collections.ConfigDict()
    config.models = "smollm2"
    config.model = ml_collections.ConfigDict({"smollm2": smollm2(), "gemma3": gemma3()})
    config.pretrained_dir = ""
    config.methods = "all"
    config.lengths = "C/4,C/2,C,2C"
    config.texts = "prose"
    config.passkey = ml_collections.ConfigDict({
        "enabled": True, "lengths": "", "depths": "0.1,0.5,0.9", "keys_per_depth": 1,
        "digits": 5, "seed": 0, "max_new_tokens": 8})
    config.tolerance = 0.10
    config.passkey_threshold = 0.9
    config.dtype = "float32"
    config.attention = ""
    config.block_size = 0
    config.calibrate_len = 512
    config.scaling_overrides = ml_collections.ConfigDict()
    return config
