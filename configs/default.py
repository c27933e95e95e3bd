"""The default experiment: a small RoPE decoder LM on the bundled Python-stdlib byte corpus.

A sensible CPU run (about 3 minutes on 2 cores): 4 layers, E=128, 4 heads, L=128, B=32,
600 steps (~2.5M tokens). Every other config in this folder starts from `get_config()` here
and changes a few keys; any key can also be overridden on the command line, e.g.
`--config.model.encoding=alibi --config.mesh.fsdp=-1 --config.num_train_steps=100`.

Keys (flax examples/lm1b names where they exist):
  seed                    init and data order (batches are a pure function of seed and step)
  num_train_steps, batch_size (global), seq_len, grad_accum_steps (microbatches per step)
  learning_rate, warmup_steps, min_lr_ratio, weight_decay, grad_clip_norm, adam_b1/b2/eps
  log_every_steps, eval_every_steps (0: only at the end), checkpoint_every_steps,
  checkpoints_to_keep, async_checkpointing
  dataset: name, data_dir, train_split, eval_split, packed, max_tokens, kwargs (builder)
  model: the `posenc_jax.model.config.TransformerConfig` fields
  mesh: sizes of the axes data, fsdp, context, tensor (-1: all remaining devices); context > 1
          splits each sequence over devices (docs/context_parallel.md)
  logical_axis_rules: (model logical axis, mesh axis | tuple | None) pairs, priority order
  eval: num_tokens (per length), lengths (eval sequence lengths), batch_size
"""

import ml_collections
from ml_collections import config_dict

from posenc_jax.model import backends

# Every logical axis of posenc_jax.model.transformer.LOGICAL_AXES must appear here.
LOGICAL_AXIS_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", "context"),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("table", None),
    ("expert", None),  # a MoE's experts (stacked weights are still split over embed -> fsdp);
    # map it to an axis embed and mlp do not use (e.g. "data") for expert parallelism
)


def model_config(**overrides) -> ml_collections.ConfigDict:
    """The `TransformerConfig` fields as a ConfigDict (optional ones as typed placeholders)."""
    model = ml_collections.ConfigDict({
        "vocab_size": 256, "num_layers": 4, "embed_dim": 128, "num_heads": 4, "mlp_dim": 384,
        "num_kv_heads": config_dict.placeholder(int), "head_dim": config_dict.placeholder(int),
        "mlp_activation": "swiglu", "encoding": "rope",
        "encoding_kwargs": ml_collections.ConfigDict(), "attention": backends.DENSE,
        "context_mode": "ring",
        "block_size": 512, "causal": True, "tie_embeddings": True, "dtype": "float32",
        "param_dtype": "float32", "norm_eps": 1e-6, "scan_layers": False, "remat": "none",
        # mixture of experts (posenc_jax.model.moe); num_experts=0: the dense MLP
        "num_experts": 0, "experts_per_token": 2, "moe_mlp_dim": config_dict.placeholder(int),
        "router": "softmax_topk_norm", "router_bias": False, "expert_bias": False,
        "shared_expert_mlp_dim": 0,
        "moe_layers": config_dict.placeholder(tuple), "moe_aux_loss_coef": 0.0})
    model.update(overrides)
    return model


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.num_train_steps = 600
    config.batch_size = 32
    config.seq_len = 128
    config.grad_accum_steps = 1

    config.learning_rate = 3e-3
    config.warmup_steps = 60
    config.min_lr_ratio = 0.1
    config.weight_decay = 0.1
    config.grad_clip_norm = 1.0
    config.adam_b1 = 0.9
    config.adam_b2 = 0.95
    config.adam_eps = 1e-8

    config.log_every_steps = 20
    config.eval_every_steps = 200
    config.checkpoint_every_steps = 200
    config.checkpoints_to_keep = 3
    config.async_checkpointing = True

    config.dataset = ml_collections.ConfigDict({
        "name": "python_stdlib", "data_dir": config_dict.placeholder(str),
        "train_split": "train", "eval_split": "validation", "packed": False,
        "max_tokens": config_dict.placeholder(int), "kwargs": ml_collections.ConfigDict()})
    config.model = model_config()
    config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "context": 1, "tensor": 1})
    config.logical_axis_rules = LOGICAL_AXIS_RULES
    config.eval = ml_collections.ConfigDict({
        "num_tokens": 65536, "lengths": (128,), "batch_size": config_dict.placeholder(int)})
    return config
