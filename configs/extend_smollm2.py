"""The context-extension study on this machine's CPU (`python -m train.extend`): SmolLM2-135M
(context C = 8192) zero-shot with none, linear (PI), ntk, dynamic and yarn at 2k, 4k, 8k and
10k (5C/4); `--config.lengths=C/4,C/2,C,2C` takes it to the issue's 16k (about 2x the time).

Keys:
  models            comma-separated names of config.model entries
  model.<name>      file (under pretrained_dir), add_bos (prepend the tokenizer's BOS),
                    passkey_lengths ('' = passkey.lengths); context C and rotary_dim (the
                    RoPE dims, for LongRoPE's factor lists) are read from the checkpoint:
                    0 here, or a value the checkpoint must hold (`train.extend.settings`)
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
                    blockwise past 2048 on a CPU, the kernel on an accelerator; this default:
                    'blockwise' at every length, the path the estimate is calibrated on)
  scan_layers       the blocks as one lax.scan (one layer compiled instead of 30; the same
                    results): what the device run sets, where compiles dominate
  calibrate_len     tokens of the forward that calibrates the time estimate (its matmuls)
  calibrate_attention_len  tokens of one layer's attention timed alone (attention's rate;
                    0: one rate for both)
  scaling_overrides <method>: keys replacing the method's stretch rule

What fits 30 minutes on 2 cores (the plan, `train.extend.plan`; the estimate printed before
the first job is calibrated on the machine that runs it):
  perplexity  five forwards of 10,241 tokens of the prose text: `none` (its prefixes give 2k,
              4k and 8k: at n <= C every method has factor 1, the unscaled model) and linear,
              ntk, dynamic, yarn at factor 1.25; each forward gives every position bucket
  passkey     the unscaled model at 2k, 4k and 8k, one prompt each (depth 50%, one key):
              every method is that model there
Measured on 2 shared cores at a load average of about 5 (docs/extend.md): the weight matmuls
ran at 47 GFLOP/s, blockwise attention at 18 GFLOP/s; a 16k forward is 13.7 TFLOP, 9.3 of it
attention, about 10 min. This default's estimate there: 28.6 min; with 16k (factor 2):
57.1 min. Cut (in configs/extend_full.py): 16k; llama3 and longrope; the code text; passkey
past C -- each prompt past C is another full prefill per method, and dynamic NTK rebuilds
the cache at every decode step past C (one more forward per new token).
`--config.passkey.lengths=C/4,C/2,C,5C/4` puts passkey past C back;
`--config.passkey.depths=0.1,0.5,0.9` gives three prompts per length.
"""

import ml_collections


def smollm2():
    return ml_collections.ConfigDict({"file": "SmolLM2-135M-Instruct.Q4_1.gguf",
                                      "context": 0, "rotary_dim": 0, "add_bos": False,
                                      "passkey_lengths": ""})


def gemma3():
    return ml_collections.ConfigDict({"file": "gemma-3-270m-q4_k_m.gguf", "context": 0,
                                      "rotary_dim": 0, "add_bos": True,
                                      "passkey_lengths": ""})


def get_config():
    config = ml_collections.ConfigDict()
    config.models = "smollm2"
    config.model = ml_collections.ConfigDict({"smollm2": smollm2(), "gemma3": gemma3()})
    config.pretrained_dir = ""
    config.methods = "none,linear,ntk,dynamic,yarn"
    config.lengths = "C/4,C/2,C,5C/4"
    config.texts = "prose"
    config.passkey = ml_collections.ConfigDict({
        "enabled": True, "lengths": "C/4,C/2,C", "depths": "0.5", "keys_per_depth": 1,
        "digits": 5, "seed": 0, "max_new_tokens": 8})
    config.tolerance = 0.10
    config.passkey_threshold = 0.9
    config.dtype = "float32"
    config.attention = "blockwise"
    config.block_size = 0
    config.scan_layers = False
    config.calibrate_len = 512
    config.calibrate_attention_len = 4096
    config.scaling_overrides = ml_collections.ConfigDict()
    return config
