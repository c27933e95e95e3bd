"""The study's plan: a pure function from a study config to the list of jobs.

`make_plan(config, workdir)` checks the study config (see configs/study.py for the keys) and
returns a `Plan`: one training config per model (all from `config.train`, differing only in
`model.encoding` and its kwargs) and the jobs, in the order they run (each model's training,
then its evaluations). It builds no mesh, loads no data and reads or writes no file: what
depends on the devices, the data or the workdir is checked by `runner.prepare`, still before
the first job. Anything wrong raises TypeError (a value of the wrong type) or ValueError,
naming the key and the value.

A job is a small frozen dataclass with a `kind` (`jobs.py`); `runner.RUNNERS` maps each kind
to the function that executes it. Length expressions: 'L/2', 'L', '2L', '2*L' or an int.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import ml_collections

import posenc_jax
from posenc_jax import checks
from posenc_jax.model.config import TransformerConfig, freeze
from train import state
from train.study import scalings
from train.study.jobs import NO_SCALING, EvalJob, Job, TrainJob, fingerprint

EVAL_ATTENTION = ("", "dense", "blockwise")
# Keys of the train config that do not change the trained weights (beyond float rounding).
_NOT_FINGERPRINTED = ("log_every_steps", "checkpoint_every_steps", "checkpoints_to_keep",
                      "async_checkpointing", "eval", "eval_every_steps", "mesh",
                      "logical_axis_rules")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a study config asks for: the models, their configs and the jobs, nothing run."""

    workdir: str                               # absolute
    config: Any                                # the study ConfigDict, as given
    encodings: tuple[str, ...]
    scalings: tuple[str, ...]
    train_len: int
    eval_lens: tuple[int, ...]
    eval_num_tokens: int
    train_configs: Mapping[str, Any]           # model -> train ConfigDict
    model_configs: Mapping[str, TransformerConfig]
    jobs: tuple[Job, ...]

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.train_configs)

    def of_kind(self, kind: str) -> list[Job]:
        return [job for job in self.jobs if job.kind == kind]

    def jobs_for(self, model: str) -> list[Job]:
        return [job for job in self.jobs if job.model == model]

    def estimate(self, job: Job) -> float:
        """Estimated seconds: FLOPs / config.estimate_gflops + compilations x compile time."""
        return (job.flops / (float(self.config.estimate_gflops) * 1e9)
                + job.compiles * float(self.config.estimate_compile_s))


def parse_names(value: Any, *, what: str, valid) -> tuple[str, ...]:
    """'a,b' (or a sequence) -> ('a', 'b'), each one of `valid`, none twice."""
    if isinstance(value, str):
        names = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)):
        names = [str(v).strip() for v in value]
    else:
        raise TypeError(f"config.{what} must be a comma-separated string, got {value!r}")
    for name in names:
        checks.one_of(what[:-1], name, tuple(valid))
    if len(set(names)) != len(names):
        raise ValueError(f"config.{what}={value!r} names an entry twice")
    return tuple(names)


def length(raw: Any, *, train_len: int) -> int:
    """One length expression ('L/2', '4L', '2*L', '100') -> a positive int (L = train_len)."""
    text = str(raw).strip().replace(" ", "")
    m = re.fullmatch(r"(\d+)?\*?L(?:/(\d+))?", text)
    if m:
        mult, div = int(m.group(1) or 1), int(m.group(2) or 1)
        if div == 0 or (mult * train_len) % div:
            raise ValueError(f"eval length {text!r} is not a whole number of tokens for "
                             f"L={train_len}")
        value = mult * train_len // div
    elif re.fullmatch(r"\d+", text):
        value = int(text)
    else:
        raise ValueError(f"eval length {raw!r} in config.eval_lengths must be a positive int "
                         "or a multiple of L such as 'L/2', 'L', '4L'")
    if value < 1:
        raise ValueError(f"eval length {raw!r} must be a positive number of tokens, got {value}")
    return value


def parse_lengths(spec: Any, *, train_len: int) -> tuple[int, ...]:
    """'L/2,L,2L,16L,3000' -> sorted distinct positive ints (L = train_len)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = {length(raw, train_len=train_len) for raw in items}
    if not out:
        raise ValueError(f"config.eval_lengths={spec!r} names no length")
    return tuple(sorted(out))


def train_fingerprint(cfg) -> str:
    return fingerprint({k: v for k, v in cfg.to_dict().items() if k not in _NOT_FINGERPRINTED})


def flops_per_token(mc: TransformerConfig, length_: int) -> float:
    """Forward FLOPs per token at sequence length `length_` (dense attention computes the
    full L x L score matrix)."""
    e, h, k, d, f = mc.embed_dim, mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.mlp_dim
    per_layer = 2 * e * h * d + 2 * e * k * d + (3 if mc.mlp_activation == "swiglu" else 2) * e * f
    return (2.0 * (mc.num_layers * per_layer + e * mc.vocab_size)
            + 4.0 * mc.num_layers * length_ * h * d)


def train_config(config, encoding: str, train_len: int):
    """`config.train` for one encoding: its kwargs from config.encoding_kwargs, the kwargs named
    in config.length_kwargs defaulting to L, no evaluation inside the trainer."""
    cfg = copy.deepcopy(config.train)
    kwargs = dict(config.encoding_kwargs.get(encoding, None) or {})
    at_length = (config.get("length_kwargs") or {}).get(encoding, None) or ""
    for key in (k.strip() for k in at_length.split(",") if k.strip()):
        kwargs.setdefault(key, train_len)
    with cfg.unlocked():
        cfg.model.encoding = encoding
        cfg.model.encoding_kwargs = ml_collections.ConfigDict(kwargs)
        cfg.eval.lengths = ()
        cfg.eval_every_steps = 0
    return cfg


def _train_job(model: str, cfg, mc: TransformerConfig) -> TrainJob:
    tokens = cfg.num_train_steps * cfg.batch_size * cfg.seq_len
    return TrainJob(model=model, fingerprint=train_fingerprint(cfg),
                    flops=3 * flops_per_token(mc, cfg.seq_len) * tokens, compiles=3)


def _eval_overrides(config, model_config: TransformerConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    attention = config.get("eval_attention") or model_config.attention
    if attention != model_config.attention:
        out["attention"] = attention
    if config.get("eval_block_size"):
        out["block_size"] = int(config.eval_block_size)
    return out


def _eval_jobs(config, model: str, cfg, mc: TransformerConfig, *, train_fp: str,
               eval_lens, scaling_names, num_tokens: int) -> list[EvalJob]:
    """Every evaluation of one model: plain at each length, then each scaling past L."""
    train_len, max_pos = cfg.seq_len, mc.input_encoding.max_positions
    common = {"model": model, "encoding": cfg.model.encoding, "train_len": train_len}
    base = _eval_overrides(config, mc)
    jobs = []
    for n in eval_lens:
        note = "" if max_pos is None or n <= max_pos else (
            f"n/a (positions >= max_len={max_pos}: the {cfg.model.encoding} table has no rows "
            "for them)")
        jobs.append(EvalJob(**common, scaling=NO_SCALING, eval_len=n, note=note,
                            overrides=freeze(base), fingerprint=fingerprint(
                                _eval_key(train_fp, n, None, num_tokens, config, note)),
                            flops=0.0 if note else flops_per_token(mc, n) * num_tokens,
                            compiles=0 if note else 1))
    if not scalings.takes_scaling(mc.layer_encoding(0)):
        return jobs
    rotary_dim = mc.layer_encoding(0).rotary_dim
    base_kwargs = dict(cfg.model.encoding_kwargs.to_dict())
    for method in scaling_names:
        over = dict((config.get("scaling_overrides") or {}).get(method, None) or {})
        for n in (n for n in eval_lens if n > train_len):
            sc = scalings.scaling_config(method, factor=n / train_len, train_len=train_len,
                                         rotary_dim=rotary_dim, overrides=over)
            kwargs = {**base_kwargs, "scaling": sc}
            state.transformer_config(cfg.model, encoding_kwargs=kwargs)  # checks it
            jobs.append(EvalJob(**common, scaling=method, eval_len=n,
                                overrides=freeze({**base, "encoding_kwargs": kwargs}),
                                fingerprint=fingerprint(
                                    _eval_key(train_fp, n, kwargs, num_tokens, config, "")),
                                flops=flops_per_token(mc, n) * num_tokens, compiles=1))
    return jobs


def _eval_key(train_fp, n, kwargs, num_tokens, config, note) -> dict:
    return {"train": train_fp, "len": n, "scaling": kwargs, "tokens": num_tokens,
            "split": config.eval_split, "note": note}


def make_plan(config, workdir: str) -> Plan:
    """Checks `config` (a study ConfigDict) and lists the jobs. Pure: see the module docstring."""
    if not isinstance(workdir, str) or not workdir:
        raise ValueError(f"workdir must be a non-empty path, got workdir={workdir!r}")
    encodings = parse_names(config.encodings, what="encodings", valid=posenc_jax.names())
    if not encodings:
        raise ValueError(f"config.encodings={config.encodings!r} names no encoding; valid "
                         f"names are: {', '.join(posenc_jax.names())}")
    scaling_names = parse_names(config.scalings, what="scalings", valid=scalings.methods())
    train_len = checks.positive_int("config.train.seq_len", config.train.seq_len)
    eval_lens = parse_lengths(config.eval_lengths, train_len=train_len)
    num_tokens = checks.positive_int("config.eval_num_tokens", config.eval_num_tokens)
    short = [n for n in eval_lens if n > num_tokens]
    if short:
        raise ValueError(f"eval length(s) {short} exceed config.eval_num_tokens={num_tokens}: "
                         "they would have zero full windows; raise eval_num_tokens or drop them")
    checks.one_of("config.eval_attention", config.get("eval_attention") or "", EVAL_ATTENTION)

    train_configs, model_configs, jobs = {}, {}, []
    for enc in encodings:
        cfg = train_config(config, enc, train_len)
        mc = state.transformer_config(cfg.model)
        max_pos = mc.input_encoding.max_positions
        if max_pos is not None and max_pos < train_len:
            raise ValueError(f"encoding {enc!r} has max_len={max_pos} < the training length "
                             f"L={train_len}: it cannot be trained at L")
        train_configs[enc], model_configs[enc] = cfg, mc
        job = _train_job(enc, cfg, mc)
        jobs.append(job)
        jobs += _eval_jobs(config, enc, cfg, mc, train_fp=job.fingerprint, eval_lens=eval_lens,
                           scaling_names=scaling_names, num_tokens=num_tokens)
    return Plan(workdir=os.path.abspath(workdir), config=config, encodings=encodings,
                scalings=scaling_names, train_len=train_len, eval_lens=eval_lens,
                eval_num_tokens=num_tokens, train_configs=train_configs,
                model_configs=model_configs, jobs=tuple(jobs))

