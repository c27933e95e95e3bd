"""Fine-tune a pretrained checkpoint, e.g. to extend its context (issue 30).

    python -m train --config=configs/extend_finetune.py --workdir=runs/ft \
        --config.init.checkpoint=$POSENC_PRETRAINED_DIR/SmolLM2-135M-Instruct.Q4_1.gguf \
        --config.init.rope_scaling=yarn:2 --config.seq_len=16384
    python -m train.export --workdir=runs/ft --out=runs/ft/hf    # transformers loads it

Your own text: `--config.dataset.name=text_dir --config.dataset.kwargs.path=DIR
--config.dataset.kwargs.pattern='**/*.md'` (or a TFDS / array_record dataset by name with
`--config.dataset.data_dir`); documents are read through the checkpoint's tokenizer, joined by
EOS (`dataset.eos_join`) or kept apart by segment ids (`dataset.packed=True`), and the held-out
split (`dataset.eval_split`) gives the evaluation.

Keys beyond configs/default.py's:
  init.checkpoint     a Hugging Face directory or a GGUF file (required)
  init.rope_scaling   '' (the checkpoint's), 'METHOD:FACTOR' (the registry's stretch rule from
                      the checkpoint's context) or a rope_scaling dict literal
  model.*             None: the checkpoint's value; attention, block_size, dtype,
                      param_dtype, scan_layers, context_mode, remat may be set; any other
                      key set must agree with the checkpoint (else an error naming both)
  dataset.tokenizer   'checkpoint' (its tokenizer) or 'bytes'; dataset.eos_join
  lora.*              enabled, rank, alpha, targets, train_norms, train_embeddings (LongLoRA:
                      both True); see train/trainable.py
  loss_chunk          positions per chunk of the loss (0: full [B, L, V] logits)
  eval.extension.*    the extension study's measures with every evaluation and a before /
                      after report (extension_report.md): perplexity by position bucket over
                      the first `length` held-out tokens (0: seq_len; buckets of C = `context`,
                      0: the checkpoint's), passkey accuracy at `passkey_lengths`; see
                      train/extension_eval.py
"""

import ml_collections
from ml_collections import config_dict

from configs import default

ARCHITECTURE = {"vocab_size": int, "num_layers": int, "embed_dim": int, "num_heads": int,
                "mlp_dim": int, "num_kv_heads": int, "head_dim": int, "mlp_activation": str,
                "encoding": str, "tie_embeddings": bool, "norm_eps": float, "causal": bool}


def model_block() -> ml_collections.ConfigDict:
    """Every architecture key None (taken from the checkpoint); the fine-tune's own keys."""
    block = {k: config_dict.placeholder(t) for k, t in ARCHITECTURE.items()}
    block.update({"attention": "auto", "block_size": 512, "dtype": "float32",
                  "param_dtype": "float32", "scan_layers": False, "context_mode": "ring",
                  "remat": "block"})  # long windows: keep only each block's input
    return ml_collections.ConfigDict(block)


def get_config() -> ml_collections.ConfigDict:
    config = default.get_config()
    config.init = ml_collections.ConfigDict({"checkpoint": "", "rope_scaling": ""})
    config.model = model_block()
    config.num_train_steps = 200
    config.batch_size = 1
    config.seq_len = 2048
    config.learning_rate = 2e-5  # the YaRN paper's fine-tune
    config.warmup_steps = 10
    config.min_lr_ratio = 1.0    # constant after warmup
    config.weight_decay = 0.0
    config.log_every_steps = 10
    config.eval_every_steps = 0
    config.checkpoint_every_steps = 50
    config.loss_chunk = 1024
    config.dataset.tokenizer = "checkpoint"
    config.dataset.eos_join = True
    config.dataset.max_tokens = 4_000_000
    config.lora = ml_collections.ConfigDict({
        "enabled": False, "rank": 8, "alpha": 16.0, "targets": "q_proj,k_proj,v_proj,o_proj",
        "train_norms": False, "train_embeddings": False})
    config.eval.lengths = (2048,)
    config.eval.num_tokens = 16384
    config.eval.extension = ml_collections.ConfigDict({
        "enabled": False, "length": 0, "context": 0, "passkey_lengths": (1024,),
        "passkey_depths": (0.5,), "passkey_digits": 5, "passkey_seed": 0})
    return config
