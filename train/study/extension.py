"""The study's second half: context extension by fine-tuning, and passkey retrieval.

Pure, like `plan` (which calls it): configs and jobs from the study config, nothing run.

  config.finetune   scalings (each a scaling method or 'none': continued pretraining), length
                    (e.g. '4L'), fraction (of the pretraining steps), batch_size (0: the
                    pretraining batch). Every model whose encoding takes a scaling is
                    fine-tuned once per method: `train.finetune`'s config (seq_len and the
                    encoding's `scaling` differ, and batch_size if given; the stream
                    continues), then evaluated at every eval length with the scaling it was
                    tuned with.
  config.passkey    enabled, lengths ('L,2L,4L,8L'), trials, eval_seed, steps, batch_size,
                    min_len, num_examples, finetune_steps. One model per encoding and seed is
                    trained from scratch on the synthetic passkey task at L (its config is
                    the perplexity model's with the passkey data, packed, and these steps and
                    batch); it is scored zero-shot, with every zero-shot scaling of
                    `config.scalings` past L, and, for encodings that take a scaling, after a
                    fine-tune at `finetune.length` with each of `finetune.scalings` (passkey
                    documents up to that length, `finetune_steps` steps).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import ml_collections

from posenc_jax import checks
from train import finetune
from train.engine import lengths, names, scalings
from train.engine.flops import train_flops
from train.engine.scalings import NO_SCALING
from train.engine.store import fingerprint
from train.study import searched
from train.study.jobs import FinetuneJob, Job, train_fingerprint

PASSKEY_DIGITS = 5


@dataclasses.dataclass(frozen=True)
class Settings:
    """config.finetune and config.passkey, checked."""

    ft_scalings: tuple[str, ...]
    ft_len: int
    ft_fraction: float
    ft_batch: int            # 0: the pretraining batch
    passkey: bool
    pk_lengths: tuple[int, ...]
    pk_trials: int
    pk_eval_seed: int
    pk_steps: int
    pk_batch: int
    pk_min_len: int
    pk_examples: int
    pk_ft_steps: int


def settings(config, *, train_len: int) -> Settings:
    """Checks config.finetune and config.passkey (absent blocks: nothing to do)."""
    ft = config.get("finetune") or ml_collections.ConfigDict()
    pk = config.get("passkey") or ml_collections.ConfigDict()
    ft_scalings = names.names(ft.get("scalings", ""), key="config.finetune.scalings",
                              valid=(*scalings.all_methods(), searched.SEARCHED))
    ft_len = lengths.length(ft.get("length", "4L"), base="L", value=train_len,
                            what="config.finetune.length")
    fraction = checks.finite_float("config.finetune.fraction", ft.get("fraction", 0.1),
                                   above=0.0, maximum=10.0)
    if ft_scalings and ft_len <= train_len:
        raise ValueError(f"config.finetune.length={ft.get('length')!r} = {ft_len} must exceed "
                         f"L={train_len}")
    enabled = checks.boolean("config.passkey.enabled", pk.get("enabled", False))
    pk_lengths = lengths.lengths(str(pk.get("lengths", "L")), base="L", value=train_len,
                                 key="config.passkey.lengths", what="passkey length")
    min_len = checks.integer("config.passkey.min_len", pk.get("min_len", 20),
                             minimum=2 * PASSKEY_DIGITS + 10)
    if enabled and min(pk_lengths) < min_len:
        raise ValueError(f"config.passkey.lengths has {min(pk_lengths)} < config.passkey.min_len="
                         f"{min_len} (the shortest passkey document)")
    if enabled and train_len < min_len:
        raise ValueError(f"passkey training needs L={train_len} >= config.passkey.min_len="
                         f"{min_len}")
    return Settings(
        ft_scalings=ft_scalings, ft_len=ft_len, ft_fraction=fraction,
        ft_batch=checks.integer("config.finetune.batch_size", ft.get("batch_size", 0),
                                minimum=0),
        passkey=enabled,
        pk_lengths=pk_lengths,
        pk_trials=checks.positive_int("config.passkey.trials", pk.get("trials", 32)),
        pk_eval_seed=checks.integer("config.passkey.eval_seed", pk.get("eval_seed", 0),
                                    minimum=0),
        pk_steps=checks.positive_int("config.passkey.steps", pk.get("steps", 600)),
        pk_batch=checks.positive_int("config.passkey.batch_size", pk.get("batch_size", 32)),
        pk_min_len=min_len,
        pk_examples=checks.positive_int("config.passkey.num_examples",
                                        pk.get("num_examples", 20000)),
        pk_ft_steps=checks.integer("config.passkey.finetune_steps",
                                   pk.get("finetune_steps", 60), minimum=0))


def passkey_config(cfg, s: Settings, *, max_len: int):
    """A model's train config on the passkey task: the data (documents of s.pk_min_len ..
    max_len bytes, packed: each document starts at position 0 and sees only itself), the
    steps and the batch differ; the model, optimizer and seed do not."""
    out = copy.deepcopy(cfg)
    with out.unlocked():
        out.dataset = ml_collections.ConfigDict({
            "name": "passkey", "data_dir": None, "train_split": "train",
            "eval_split": "validation", "packed": True, "max_tokens": None,
            "kwargs": {"seed": 0, "num_examples": s.pk_examples, "min_len": s.pk_min_len,
                       "max_len": max_len}})
        out.num_train_steps = s.pk_steps
        out.batch_size = s.pk_batch
        out.warmup_steps = min(int(cfg.warmup_steps), max(1, s.pk_steps // 10))
        out.checkpoint_every_steps = s.pk_steps
    return out


def _scaled_kwargs(method: str, cfg, mc, *, factor: float, overrides) -> dict[str, Any]:
    kwargs = dict(cfg.model.encoding_kwargs.to_dict())
    if method == NO_SCALING:
        return kwargs
    sc = scalings.scaling_config(method, factor=factor, train_len=cfg.seq_len,
                                 rotary_dim=mc.layer_encoding(0).rotary_dim,
                                 overrides=dict(overrides.get(method, None) or {}))
    return {**kwargs, "scaling": sc}


def finetunes(config, s: Settings, *, model: str, cfg, mc, base_fp: str, steps: int,
              max_len: int | None = None) -> list[tuple[str, str, Any, list[Job]]]:
    """[(model id, method, fine-tune config, jobs)] for every method of s.ft_scalings; none
    when the encoding takes no scaling (or steps is 0). The jobs are the `FinetuneJob`, after
    its search for `longrope-searched` (the paper: search at the fine-tune length on the
    pretrained model, then fine-tune with the factors found; perplexity models only, as for
    its zero-shot rows: a passkey model, `max_len` given, has no searched fine-tune)."""
    if not steps or not scalings.takes_scaling(mc.layer_encoding(0)):
        return []
    over = config.get("scaling_overrides") or {}
    out = []
    for method in s.ft_scalings:
        name, search = f"{model}.ft-{method}", None
        if method == searched.SEARCHED:
            if max_len is not None:
                continue
            search = searched.plan_search(config, model=name, train_fp=base_fp, mc=mc,
                                          train_len=cfg.seq_len, target_len=s.ft_len,
                                          source=model)
            kwargs = dict(cfg.model.encoding_kwargs.to_dict())  # the search's, at run time
        else:
            kwargs = _scaled_kwargs(method, cfg, mc, factor=s.ft_len / cfg.seq_len,
                                    overrides=over)
        if method not in (NO_SCALING, searched.SEARCHED) and scalings.refusal(
                cfg.model, kwargs, rotary_dim=mc.layer_encoding(0).rotary_dim):
            continue  # the encoding does not support this method (its zero-shot rows say why)
        ft_cfg = finetune.finetune_config(cfg, seq_len=s.ft_len, steps=steps,
                                          encoding_kwargs=kwargs)
        with ft_cfg.unlocked():
            if max_len is not None:
                ft_cfg.dataset.kwargs.max_len = max_len
            if s.ft_batch:
                ft_cfg.batch_size = s.ft_batch
        fp = fingerprint({"config": train_fingerprint(ft_cfg), "base": base_fp,
                          **({"search": search.fingerprint} if search else {})})
        tokens = steps * ft_cfg.batch_size * s.ft_len
        job = FinetuneJob(model=name, base=model, step=int(cfg.num_train_steps),
                          fingerprint=fp, compiles=3,
                          flops=train_flops(mc, s.ft_len, tokens),
                          search=(search.name, search.fingerprint) if search else ())
        out.append((name, method, ft_cfg, [search, job] if search else [job]))
    return out

