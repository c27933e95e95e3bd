"""The optimiser: AdamW with linear warmup, cosine decay and global-norm clipping.

Config keys read here (all top-level in the experiment config):
  learning_rate      peak learning rate
  warmup_steps       linear warmup from lr/warmup_steps at the first update to the peak
  num_train_steps    the cosine decays from the peak to `learning_rate * min_lr_ratio` here
  min_lr_ratio       end of the cosine as a fraction of the peak (default 0.1)
  weight_decay       decoupled AdamW decay, applied to matrices only (ndim >= 2)
  grad_clip_norm     clip the global gradient norm to this value (<= 0: no clipping)
  adam_b1, adam_b2, adam_eps
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

#: Every config key the optimizer reads (also the part of a config that its compiled steps
#: depend on, besides the model, mesh and rules).
OPTIMIZER_KEYS = ("learning_rate", "warmup_steps", "num_train_steps", "min_lr_ratio",
                  "weight_decay", "grad_clip_norm", "adam_b1", "adam_b2", "adam_eps")


def make_schedule(*, learning_rate: float, warmup_steps: int, num_train_steps: int,
                  min_lr_ratio: float = 0.1) -> optax.Schedule:
    """Learning rate as a function of the update count (0 at the first update), float32.

    Warmup: lr * (count + 1) / warmup_steps for the first `warmup_steps` updates, so the first
    update already moves; then a cosine from lr to lr * min_lr_ratio at `num_train_steps`.
    """
    if learning_rate < 0 or not math.isfinite(learning_rate):
        raise ValueError(f"learning_rate must be finite and >= 0, got {learning_rate}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    peak = float(learning_rate)
    end = peak * float(min_lr_ratio)
    decay_steps = max(int(num_train_steps) - int(warmup_steps), 1)

    def schedule(count):
        count = jnp.asarray(count, jnp.float32)
        warm = peak * (count + 1.0) / max(int(warmup_steps), 1)
        progress = jnp.clip((count - warmup_steps) / decay_steps, 0.0, 1.0)
        cosine = end + (peak - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return jnp.where(count < warmup_steps, warm, cosine)

    return schedule


def _decay_mask(params: Any) -> Any:
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optax transformation, learning-rate schedule) from the experiment config."""
    schedule = make_schedule(
        learning_rate=config.learning_rate, warmup_steps=config.warmup_steps,
        num_train_steps=config.num_train_steps,
        min_lr_ratio=config.get("min_lr_ratio", 0.1))
    parts = []
    clip = float(config.get("grad_clip_norm", 0.0) or 0.0)
    if clip > 0:
        parts.append(optax.clip_by_global_norm(clip))
    parts.append(optax.adamw(
        schedule, b1=config.get("adam_b1", 0.9), b2=config.get("adam_b2", 0.95),
        eps=config.get("adam_eps", 1e-8), weight_decay=config.get("weight_decay", 0.0),
        mask=_decay_mask))
    return optax.chain(*parts), schedule
