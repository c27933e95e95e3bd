"""The whole experiment config, checked before a run touches its workdir or takes a step.

Every key the trainer reads is checked here with `posenc_jax.checks` and named as the user
types it on the command line (`config.eval.lengths[0]`, `config.model: ...`), so a setting
that cannot work fails at once instead of after training (`eval.lengths=(0,)`), never
(`checkpoints_to_keep=0` kept nothing and exited 0) or with NaN in the logs (a learned
position table evaluated past its length).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax

from posenc_jax.checks import boolean, finite_float, integer, one_of, positive_int
from posenc_jax.model import backends
from train import from_checkpoint, trainable
from train import state as state_lib

#: Keys that must be ints >= 1.
POSITIVE_INTS = ("num_train_steps", "batch_size", "seq_len", "grad_accum_steps",
                 "log_every_steps", "checkpoint_every_steps", "checkpoints_to_keep")


def _optional(check, name: str, value: Any, **kwargs) -> Any:
    return None if value is None else check(name, value, **kwargs)


def _check_optimizer(config) -> None:
    get = config.get
    finite_float("config.learning_rate", config.learning_rate, minimum=0.0)
    integer("config.warmup_steps", get("warmup_steps", 0), minimum=0)
    finite_float("config.min_lr_ratio", get("min_lr_ratio", 0.1), minimum=0.0, maximum=1.0)
    finite_float("config.weight_decay", get("weight_decay", 0.0), minimum=0.0)
    _optional(finite_float, "config.grad_clip_norm", get("grad_clip_norm"), minimum=0.0)
    for key, default in (("adam_b1", 0.9), ("adam_b2", 0.95)):
        finite_float(f"config.{key}", get(key, default), minimum=0.0, below=1.0)
    finite_float("config.adam_eps", get("adam_eps", 1e-8), above=0.0)


def _check_eval(config) -> tuple[int, ...]:
    ev = config.eval
    positive_int("config.eval.num_tokens", ev.num_tokens)
    _optional(positive_int, "config.eval.batch_size", ev.get("batch_size"))
    lengths = ev.lengths
    if isinstance(lengths, (str, bytes, Mapping)) or not isinstance(lengths, Sequence):
        raise TypeError(f"config.eval.lengths must be a tuple of ints, got "
                        f"config.eval.lengths={lengths!r} ({type(lengths).__name__})")
    return tuple(positive_int(f"config.eval.lengths[{i}]", n) for i, n in enumerate(lengths))


def _check_mesh(config) -> None:
    for axis, size in dict(config.mesh).items():
        size = integer(f"config.mesh.{axis}", size, minimum=-1)
        if size == 0:
            raise ValueError(f"config.mesh.{axis} must be >= 1 or -1 (all remaining devices), "
                             f"got config.mesh.{axis}=0")


def _check_model(config, lengths: tuple[int, ...]):
    if from_checkpoint.checkpoint_path(config):  # its errors name config.init / config.model
        model = state_lib.model_config_of(config)
    else:
        try:
            model = state_lib.transformer_config(config.model)
        except (TypeError, ValueError) as err:
            raise type(err)(f"config.model: {err}") from None
    limit = model.max_positions
    if limit is not None:
        for key, length in (("config.seq_len", config.seq_len),
                            *((f"config.eval.lengths[{i}]", n) for i, n in enumerate(lengths))):
            if length > limit:
                raise ValueError(
                    f"{key}={length} exceeds the {limit} positions of the "
                    f"{model.encoding!r} encoding's table (config.model.encoding_kwargs); "
                    "its positions past the table have no embedding")
    return model


def _check_context(config, model) -> None:
    """What context parallelism (`mesh.context` != 1) cannot run, with the real conflict: the
    ring / all-gather computes attention with its own steps (blockwise, or the Pallas kernel
    on cuda / tpu), so a backend named in `model.attention` must at least lower here, and no
    device ever holds a whole row of logits, which a RowBias (CoPE) needs."""
    platform = {"gpu": "cuda"}.get(jax.default_backend(), jax.default_backend())
    context = config.mesh.get("context", 1)
    if model.attention != backends.AUTO:
        record = backends.get(model.attention)
        if platform not in record.platforms:
            also = (f"; with config.mesh.context={context} the context-parallel steps would "
                    "have replaced it without a word" if context != 1 else "")
            raise ValueError(f"config.model.attention={model.attention!r} does not lower for "
                             f"this platform {platform!r} (only {sorted(record.platforms)})"
                             f"{also}; use 'auto', 'dense' or 'blockwise'")
    if context == 1:
        return
    for i in range(model.num_layers):
        encoding = model.layer_encoding(i)
        if backends.bias_kind(encoding) == "rows":
            raise ValueError(
                f"config.model.encoding={encoding.name!r} reads whole rows of attention logits "
                f"(a RowBias), but config.mesh.context={context} splits every row's keys over "
                f"devices, so no device holds a whole row; use config.mesh.context=1 with "
                f"{encoding.name!r}, or an encoding without a RowBias")


def _check_expert_rule(config, model) -> None:
    """A MoE's stacked weights [X, E, F] carry ("expert", "embed", "mlp"): a mesh axis can split
    one of their dimensions only (XLA's error would name neither the rule nor the weight)."""
    if not model.num_experts:
        return
    rules = [(str(k), v if isinstance(v, (tuple, list)) else (v,))
             for k, v in config.logical_axis_rules]
    first = {k: {a for a in v if a is not None} for k, v in reversed(rules)}  # first rule wins
    for other in ("embed", "mlp"):
        shared = sorted(first.get("expert", set()) & first.get(other, set()))
        if shared:
            raise ValueError(
                f"config.logical_axis_rules maps 'expert' and {other!r} both to the mesh axis "
                f"{shared[0]!r}, but a MoE layer's stacked weights [X, E, F] carry both names "
                "and a mesh axis splits one dimension of an array: map 'expert' to an axis "
                "'embed' and 'mlp' do not use (e.g. 'data', expert parallelism) or to None")


def check_config(config) -> None:
    """Raises TypeError/ValueError naming `config.<key>` for the first key that cannot work."""
    integer("config.seed", config.seed)
    for key in POSITIVE_INTS:
        positive_int(f"config.{key}", config.get(key, 1))
    if config.batch_size % config.get("grad_accum_steps", 1):
        raise ValueError(f"config.grad_accum_steps={config.grad_accum_steps} must divide "
                         f"config.batch_size={config.batch_size}")
    integer("config.eval_every_steps", config.get("eval_every_steps") or 0, minimum=0)
    boolean("config.async_checkpointing", config.get("async_checkpointing", True))
    boolean("config.dataset.packed", config.dataset.get("packed", False))
    _optional(positive_int, "config.dataset.max_tokens", config.dataset.get("max_tokens"))
    boolean("config.dataset.eos_join", config.dataset.get("eos_join", False))
    one_of("config.dataset.tokenizer", config.dataset.get("tokenizer", "bytes"),
           ("bytes", "checkpoint"))
    integer("config.loss_chunk", config.get("loss_chunk", 0) or 0, minimum=0)
    trainable.from_config(config)
    if config.dataset.get("tokenizer", "bytes") == "checkpoint" and \
            not from_checkpoint.checkpoint_path(config):
        raise ValueError("config.dataset.tokenizer='checkpoint' needs config.init.checkpoint "
                         "(the checkpoint whose tokenizer reads the text)")
    _check_optimizer(config)
    _check_mesh(config)
    model = _check_model(config, _check_eval(config))
    _check_expert_rule(config, model)
    _check_context(config, model)
