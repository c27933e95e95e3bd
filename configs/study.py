"""The length-extrapolation study on this machine's CPU (`python -m train.study`).

Trains one model per registered encoding at L = 64 on the bundled Python-stdlib byte corpus,
everything else identical, and evaluates each at L/2 .. 16L (32 .. 1024 tokens), RoPE also
with every scaling method past L; fine-tunes RoPE at 4L with each context-extension method;
trains one passkey-retrieval model per encoding and scores it at L .. 8L. Sized to finish
within 15 minutes on 2 CPU cores for one seed: 13 min 25 s on a fresh clone, install included,
with its two worker processes (2026-12-01; README).

Keys:
  encodings          comma-separated registry names (`--config.encodings=rope,alibi`), or
                     'all': every registered encoding, those in `encoding_order` first
  encoding_order     the order of 'all' (names not registered are skipped)
  encodings_excluded registered names that 'all' leaves out
  variants           <name>: {encoding, model}: entries beside the encodings, each an encoding
                     trained with other attention settings (TransformerConfig fields; lengths
                     may be written over L): see `train.study.entries`
  seeds              comma-separated train seeds ('0,1,2'; '': train.seed): every model once
                     per seed (names get '.s<seed>' except train.seed's); the
                     tables show the median and min-max, the figures min-max bars
  workers            processes that run the models (each trains one, then scores it): 0 is
                     one per CPU core on a CPU backend (at most 8) and 1 on an accelerator;
                     1 runs everything in this process (`train.engine.workers`)
  finetune           scalings (methods, 'none' = continued pretraining; '' for no fine-tuning),
                     length ('4L'), fraction (of the pretraining steps), batch_size (0: the
                     pretraining batch): see `train.study.extension`
  passkey            enabled, lengths, trials, eval_seed, steps, batch_size, min_len,
                     num_examples, finetune_steps: see `train.study.extension`
  claims             <label>: the seed chapter's "supported length" claim, shown beside ours
  scalings           RoPE scaling methods evaluated past L: linear, ntk, dynamic, yarn,
                     llama3, longrope (the NTK rule's factors), longrope-searched (factors
                     searched per model and length: `train.study.searched`) ('' for none);
                     factor = eval_len / L
  longrope_search    the searched method's search: generations, population, parents,
                     mutations, crossovers, rate, seed, tokens, split, starts
  scaling_overrides  <method>: keys replacing the method's stretch rule (its record in
                     `posenc_jax.encodings.rope_scaling`; `train.engine.scalings`)
  eval_lengths       comma-separated ints or multiples of L ('L/2', 'L', '4L')
  eval_num_tokens    targets scored at every length (the same tokens for all)
  eval_split         the held-out split evaluated
  eval_batch_tokens  tokens per eval batch (windows = this // eval_len, at least 1)
  eval_attention     '' (as trained), 'dense' or 'blockwise' for evaluation
  eval_block_size    blockwise block size at eval (0: the model's)
  max_eval_memory_gb an eval length whose estimated peak memory is above this is an error
  encoding_kwargs    <encoding>: kwargs
  length_kwargs      <encoding>: comma-separated kwargs that default to L (the learned
                     table's max_len, T5's max_distance)
  estimate_gflops, estimate_compile_s, estimate_search_gflops   the cost model behind the
                     printed time estimate (the last: the searches' evaluations)
  train              the training config of every model (configs/default.py's keys); its
                     seq_len is L and its seed the init and data-order seed
"""

import ml_collections

from configs import default
from posenc_jax.model import backends


RULES = "linear,ntk,dynamic,yarn,llama3,longrope"  # the zero-shot scaling methods by rule


def with_variants_and_search(config):
    """`config` with issue 31's variants and issue 35's `longrope-searched` rows put back."""
    config.encodings_excluded = "mrope"
    config.scalings = RULES + ",longrope-searched"
    return config


def get_config():
    config = ml_collections.ConfigDict()
    config.encodings = "all"
    config.encoding_order = ("sinusoidal,learned,rope,alibi,t5,shaw,nope,kerple,sandwich,fire,"
                             "xpos,cope,rope-window-sinks,rope-chunk-nope")
    # Issue 31's attention, at the study's scale. gpt-oss: RoPE with a sliding window (L/2)
    # and a learned sink logit per head in every softmax denominator. Llama 4: chunked RoPE
    # attention (chunks of L/2) then a global NoPE layer whose queries are scaled by the
    # temperature log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1; Llama 4 has one
    # NoPE layer in four and floor_scale = its chunk (8192): here one of the study's two
    # layers, and floor_scale = the chunk, L/2, so the temperature acts at these lengths
    # (1 below L/2, 1.11 at L, 1.35 at 16L). Llama 4's QK L2-norm on the chunked layers is
    # left out: one change at a time against `rope` and `nope`.
    config.variants = ml_collections.ConfigDict({
        "rope-window-sinks": {"encoding": "rope", "model": {
            "sliding_window": "L/2", "attention_sinks": True}},
        "rope-chunk-nope": {"encoding": "rope", "model": {
            "layer_pattern": [{"chunk": "L/2"}, {"encoding": "nope", "temperature": True}],
            "attn_temperature": {"floor_scale": "L/2", "attn_scale": 0.1}}}})
    # M-RoPE on text-only positions is RoPE (all sections get the same position); it would
    # also double the fine-tunes. Name it in --config.encodings to study it. The two variants
    # and `longrope-searched` (below) are left out of the CPU default so that it stays within
    # its 15 minutes: each variant takes every scaling and fine-tune RoPE takes (the searches
    # are cheap since one program serves every candidate: 1.5-21 s per search here, where they
    # compiled 24 models per length before; docs/study/new_rows.md).
    # `with_variants_and_search` (configs/study_full.py applies it) or the two flags
    #   --config.encodings_excluded=mrope --config.scalings=<the rules>,longrope-searched
    # put them in.
    config.encodings_excluded = "mrope,rope-window-sinks,rope-chunk-nope"
    config.seeds = ""   # "": config.train.seed alone
    config.workers = 0  # one per core on a CPU (1.5x faster on 2 cores than one process)
    config.finetune = ml_collections.ConfigDict({
        "scalings": "none,linear,ntk,yarn,longrope,llama3",  # dynamic: inference-time only
        "length": "4L", "fraction": 0.1,
        "batch_size": 8})  # 8 x 4L: the pretraining batch's tokens per step (0: 32 x 4L)
    config.passkey = ml_collections.ConfigDict({
        "enabled": True, "lengths": "L,2L,4L,8L", "trials": 32, "eval_seed": 0, "steps": 600,
        "batch_size": 32, "min_len": 20, "num_examples": 20000, "finetune_steps": 60})
    config.claims = ml_collections.ConfigDict({   # the seed chapter's table
        "rope": "any, after continued pretraining",
        "rope+linear": "2-4x, fine-tuning recommended",
        "rope+ntk": "4-8x, fine-tuning recommended",
        "rope+yarn": "8-16x, fine-tuning recommended"})
    config.scalings = RULES
    # LongRoPE's search per model and eval length past L, small: 8 + 2 x 8 = 24 evaluations
    # on 2,048 validation bytes (the paper: 64 + 40 x 32), one compiled program per search.
    # Measured: 1.5-9 s per search at 2L-8L, 17-21 s at 16L, on the 2 shared vCPUs at load
    # 8-10 with 2 workers (docs/study/new_rows.md; 134-305 s when every candidate compiled);
    # 4 per model that takes a scaling. Their forwards (batch-1 windows, the model's dense
    # attention) ran at about 3 GFLOP/s there: the estimate's rate for them.
    config.longrope_search = ml_collections.ConfigDict({
        "generations": 2, "population": 8, "parents": 4, "mutations": 4, "crossovers": 4,
        "rate": 0.3, "seed": 0, "tokens": 2048, "split": "validation", "starts": ""})
    config.scaling_overrides = ml_collections.ConfigDict()
    config.eval_lengths = "L/2,L,2L,4L,8L,16L"
    config.eval_num_tokens = 32768
    config.eval_split = "test"
    config.eval_batch_tokens = 4096
    config.eval_attention = backends.BLOCKWISE  # same numbers as dense (to 1e-7), faster at 16L here
    config.eval_block_size = 128
    config.max_eval_memory_gb = 6.0
    config.encoding_kwargs = ml_collections.ConfigDict(
        {"learned": {}, "t5": {}, "shaw": {"max_relative_position": 16}})
    config.length_kwargs = ml_collections.ConfigDict({"learned": "max_len", "t5": "max_distance"})
    # Calibrated: the default study's estimate for one process (1,135 s) against its measured
    # 1,147 s on 2 cores (2026-12-01).
    config.estimate_gflops = 35.0
    config.estimate_compile_s = 1.0
    config.estimate_search_gflops = 3.0  # the searches' evaluations (see longrope_search)

    train = default.get_config()
    train.seed = 0
    train.seq_len = 64
    train.batch_size = 32
    train.num_train_steps = 600
    train.learning_rate = 3e-3
    train.warmup_steps = 60
    train.log_every_steps = 50
    train.checkpoint_every_steps = 200
    train.checkpoints_to_keep = 1
    train.eval_every_steps = 0
    train.model.update(num_layers=2, embed_dim=64, num_heads=4, mlp_dim=192)
    config.train = train
    return config


def shrink_train_for_tests(train, *, seq_len: int) -> None:
    """A study's `train` block at the size a CPU test trains in seconds: 3 steps of 8 x
    `seq_len` on 40 corpus files, one layer of width 16 (study_tiny, study_ex5:smoke)."""
    train.seq_len = seq_len
    train.batch_size = 8
    train.num_train_steps = 3
    train.warmup_steps = 1
    train.log_every_steps = 1
    train.checkpoint_every_steps = 3
    train.async_checkpointing = False
    train.dataset.kwargs.max_files = 40
    train.model.update(num_layers=1, embed_dim=16, num_heads=2, mlp_dim=32)
