"""The study's plan: a pure function from a study config to the list of jobs.

`make_plan(config, workdir)` checks the study config (see configs/study.py for the keys) and
returns a `Plan`: one training config per model (all from `config.train`, differing only in
`model.encoding` and its kwargs) and the jobs, in the order they run (each model's training,
then its evaluations). It builds no mesh, loads no data and reads or writes no file: what
depends on the devices, the data or the workdir is checked by `execute.prepare`, still before
the first job. Anything wrong raises TypeError (a value of the wrong type) or ValueError,
naming the key and the value.

A job is a small frozen dataclass with a `kind` (`jobs.py`); `execute.RUNNERS` maps each kind
to the function that executes it. Length expressions: 'L/2', 'L', '2L', '2*L' or an int (the
engine's grammar, `train.engine.lengths`, over the base L = config.train.seq_len).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import ml_collections

import posenc_jax
from posenc_jax import checks
from posenc_jax.model import backends
from posenc_jax.model.config import TransformerConfig, freeze
from train import state
from train.engine import lengths, names, scalings
from train.engine.flops import dense_forward_flops_per_token as flops_per_token
from train.engine.flops import train_flops
from train.engine.scalings import NO_SCALING
from train.engine.store import fingerprint
from train.study import entries, extension, searched
from train.study.jobs import EvalJob, Job, PasskeyJob, TrainJob, train_fingerprint

#: What `config.eval_attention` may name: "" (as trained) or a backend that lowers everywhere.
EVAL_ATTENTION = ("", *(n for n in backends.names()
                        if set(backends.PLATFORMS) <= backends.get(n).platforms))
@dataclasses.dataclass(frozen=True)
class Plan:
    """What a study config asks for: the models, their configs and the jobs, nothing run."""

    workdir: str                               # absolute
    config: Any                                # the study ConfigDict, as given
    encodings: tuple[str, ...]
    scalings: tuple[str, ...]
    seeds: tuple[int, ...]
    settings: extension.Settings               # config.finetune, config.passkey
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
        """Estimated seconds: FLOPs / the job kind's rate (`config[job.rate_key]`, default
        config.estimate_gflops) + compilations x config.estimate_compile_s."""
        rate = self.config.get(job.rate_key) or self.config.estimate_gflops
        return (job.flops / (float(rate) * 1e9)
                + job.compiles * float(self.config.estimate_compile_s))


def parse_lengths(spec: Any, *, train_len: int) -> tuple[int, ...]:
    """config.eval_lengths ('L/2,L,2L,16L,3000') -> sorted distinct positive ints."""
    return lengths.lengths(spec, base="L", value=train_len, key="config.eval_lengths",
                           what="eval length")


def encoding_names(config) -> tuple[str, ...]:
    """config.encodings as entry names: registered encodings and `config.variants`
    (`train.study.entries.entry_names`)."""
    return entries.entry_names(config)


def parse_seeds(value: Any, *, default: int) -> tuple[int, ...]:
    """config.seeds ('0,1,2', a sequence, or '' for `default`) -> distinct seeds >= 0."""
    items = [x for x in (value.split(",") if isinstance(value, str) else
                         [value] if isinstance(value, int) else list(value)) if str(x).strip()]
    seeds = tuple(checks.integer("config.seeds", int(x) if str(x).strip().isdigit() else x,
                                 minimum=0) for x in items) or (int(default),)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"config.seeds={value!r} names a seed twice")
    return seeds


def model_name(encoding: str, seed: int, base_seed: int) -> str:
    """A model's directory: the encoding, plus `.s<seed>` for seeds other than
    config.train.seed (so a one-seed study keeps the names it always had)."""
    return encoding if seed == base_seed else f"{encoding}.s{seed}"


def train_config(config, name: str, train_len: int, *, seed: int | None = None):
    """`config.train` for one entry (`train.study.entries`: an encoding, or a variant whose
    model keys replace config.train.model's): its kwargs from config.encoding_kwargs (by the
    entry's name, else its encoding's), the kwargs named in config.length_kwargs defaulting
    to L, no evaluation inside the trainer."""
    entry = entries.entry(config, name, train_len=train_len)
    cfg = copy.deepcopy(config.train)
    kw = config.encoding_kwargs
    kwargs = dict(kw.get(name, None) or kw.get(entry.encoding, None) or {})
    at_length = (config.get("length_kwargs") or {}).get(entry.encoding, None) or ""
    for key in (k.strip() for k in at_length.split(",") if k.strip()):
        kwargs.setdefault(key, train_len)
    with cfg.unlocked():
        cfg.model.encoding = entry.encoding
        cfg.model.encoding_kwargs = ml_collections.ConfigDict(kwargs)
        for key, value in entry.overrides.items():
            cfg.model[key] = value
        if seed is not None:
            cfg.seed = int(seed)
        cfg.eval.lengths = ()
        cfg.eval_every_steps = 0
    return cfg


def _train_job(model: str, cfg, mc: TransformerConfig) -> TrainJob:
    tokens = cfg.num_train_steps * cfg.batch_size * cfg.seq_len
    return TrainJob(model=model, fingerprint=train_fingerprint(cfg),
                    flops=train_flops(mc, cfg.seq_len, tokens), compiles=3)


def eval_attention(config, model_config: TransformerConfig) -> str:
    """The attention a model is evaluated with: `config.eval_attention` where every encoding
    of the model can run it (the backend registry's `supports`), else the attention it was
    trained with (CoPE reads whole rows of logits, so it is scored with dense attention)."""
    attention = config.get("eval_attention") or model_config.attention
    try:
        for i in range(model_config.num_layers):
            backends.check(attention, model_config.layer_encoding(i), causal=model_config.causal)
    except ValueError:
        return model_config.attention
    return attention


def _eval_overrides(config, model_config: TransformerConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    attention = eval_attention(config, model_config)
    if attention != model_config.attention:
        out["attention"] = attention
    if config.get("eval_block_size"):
        out["block_size"] = int(config.eval_block_size)
    return out


@dataclasses.dataclass(frozen=True)
class Scoring:
    """What the evaluations of a model measure: `job` (EvalJob or PasskeyJob) with the job
    fields `extra`, `key` (what the result depends on besides the model), and the tokens
    scored at length n (`tokens_per_window` x windows), for the cost estimate."""

    job: type
    key: Mapping[str, Any]
    extra: Mapping[str, Any]
    windows: int = 0          # passkey: documents per length; 0: num_tokens // n windows
    num_tokens: int = 0
    searchable: bool = False  # the searched method applies (a perplexity fitness exists)

    def tokens(self, n: int) -> int:
        return self.windows * n if self.windows else self.num_tokens


def eval_jobs(config, model: str, cfg, mc: TransformerConfig, *, train_fp: str, lengths,
              scaling_names, scoring: Scoring, seed: int, train_len: int, entry: str = "",
              tuned: tuple[str, int, int] | None = None, tuned_search: tuple = ()
              ) -> list[Job]:
    """Every evaluation of one model of the entry `entry` (results' `encoding`; default the
    model's encoding): plain at each length, then each scaling past L (the pretraining length
    `train_len`); the searched method's evaluations each follow their search
    (`train.study.searched`; perplexity scorings only). A fine-tuned model (`tuned` =
    (scaling, steps, length)) is evaluated only as it was tuned (the searched method's with
    the factors of `tuned_search`, the (name, fingerprint) of its fine-tune's search)."""
    max_pos = mc.max_positions
    scaling, steps, ft_len = tuned or (NO_SCALING, 0, 0)
    common = {"model": model, "encoding": entry or cfg.model.encoding, "seed": seed,
              "finetune_steps": steps, "finetune_len": ft_len, **scoring.extra}
    base = _eval_overrides(config, mc)
    jobs = []

    def add(n, kwargs, note, method, search=None, reads=()):
        key = {"train": train_fp, "len": n, "scaling": kwargs, "note": note, **scoring.key,
               **({"search": search.fingerprint} if search else {})}
        if search:
            jobs.append(search)
            reads = (search.name, search.fingerprint)
        jobs.append(scoring.job(**common, scaling=method, eval_len=n, note=note,
                                train_len=train_len, search=reads,
                                overrides=freeze({**base, **({"encoding_kwargs": kwargs}
                                                             if kwargs else {})}),
                                fingerprint=fingerprint(key),
                                flops=0.0 if note else
                                flops_per_token(mc, n) * scoring.tokens(n),
                                compiles=0 if note else 1))

    for n in lengths:
        note = "" if max_pos is None or n <= max_pos else (
            f"n/a (positions >= max_len={max_pos}: the {cfg.model.encoding} table has no rows "
            "for them)")
        add(n, None, note, scaling, reads=tuned_search)
    if tuned is not None or not scalings.takes_scaling(mc.layer_encoding(0)):
        return jobs
    rotary_dim = mc.layer_encoding(0).rotary_dim
    base_kwargs = dict(cfg.model.encoding_kwargs.to_dict())
    for method in scaling_names:
        if method == searched.SEARCHED:
            for n in (n for n in lengths if n > train_len and scoring.searchable):
                add(n, None, "", method, search=searched.plan_search(
                    config, model=model, train_fp=train_fp, mc=mc, train_len=train_len,
                    target_len=n))
            continue
        over = dict((config.get("scaling_overrides") or {}).get(method, None) or {})
        for n in (n for n in lengths if n > train_len):
            sc = scalings.scaling_config(method, factor=n / train_len, train_len=train_len,
                                         rotary_dim=rotary_dim, overrides=over)
            kwargs = {**base_kwargs, "scaling": sc}
            refused = scalings.refusal(cfg.model, kwargs, rotary_dim=rotary_dim)
            add(n, kwargs, f"n/a ({refused})" if refused else "", method)
    return jobs


def make_plan(config, workdir: str) -> Plan:
    """Checks `config` (a study ConfigDict) and lists the jobs. Pure: see the module docstring."""
    if not isinstance(workdir, str) or not workdir:
        raise ValueError(f"workdir must be a non-empty path, got workdir={workdir!r}")
    encodings = encoding_names(config)
    if not encodings:
        raise ValueError(f"config.encodings={config.encodings!r} names no encoding; valid "
                         f"names are: {', '.join(posenc_jax.names())}")
    scaling_names = names.names(config.scalings, key="config.scalings",
                                valid=searched.methods())
    if searched.SEARCHED in scaling_names:
        searched.settings(config)  # its errors before any job
    train_len = checks.positive_int("config.train.seq_len", config.train.seq_len)
    eval_lens = parse_lengths(config.eval_lengths, train_len=train_len)
    num_tokens = checks.positive_int("config.eval_num_tokens", config.eval_num_tokens)
    short = [n for n in eval_lens if n > num_tokens]
    if short:
        raise ValueError(f"eval length(s) {short} exceed config.eval_num_tokens={num_tokens}: "
                         "they would have zero full windows; raise eval_num_tokens or drop them")
    checks.one_of("config.eval_attention", config.get("eval_attention") or "", EVAL_ATTENTION)

    ext = extension.settings(config, train_len=train_len)
    seeds = parse_seeds(config.get("seeds", ""), default=config.train.seed)
    ft_steps = max(1, round(ext.ft_fraction * config.train.num_train_steps))
    lm = Scoring(job=EvalJob, key={"tokens": num_tokens, "split": config.eval_split}, extra={},
                 num_tokens=num_tokens, searchable=True)
    pk = Scoring(job=PasskeyJob, key={"trials": ext.pk_trials, "eval_seed": ext.pk_eval_seed,
                                      "digits": extension.PASSKEY_DIGITS},
                 extra={"trials": ext.pk_trials, "eval_seed": ext.pk_eval_seed},
                 windows=ext.pk_trials)
    train_configs, model_configs, jobs = {}, {}, []

    def add(job, cfg, scoring, lengths, *, entry, tuned=None, zero_shot=scaling_names,
            before=()):
        mc = state.transformer_config(cfg.model)
        train_configs[job.model], model_configs[job.model] = cfg, mc
        jobs.extend([*before, job])  # before: a fine-tune's search
        jobs.extend(eval_jobs(config, job.model, cfg, mc, train_fp=job.fingerprint,
                              lengths=lengths, scaling_names=zero_shot, scoring=scoring,
                              seed=cfg.seed, train_len=train_len, entry=entry, tuned=tuned,
                              tuned_search=getattr(job, "search", ())))
        return mc

    for seed in seeds:
        for enc in encodings:
            cfg = train_config(config, enc, train_len, seed=seed)
            mc = state.transformer_config(cfg.model)
            max_pos = mc.max_positions
            if max_pos is not None and max_pos < train_len:
                raise ValueError(f"encoding {enc!r} has max_len={max_pos} < the training "
                                 f"length L={train_len}: it cannot be trained at L")
            models = [(_train_job(model_name(enc, seed, config.train.seed), cfg, mc), cfg, lm,
                       eval_lens, ft_steps, None)]
            if ext.passkey:
                pk_cfg = extension.passkey_config(cfg, ext, max_len=train_len)
                models.append((_train_job(f"{models[0][0].model}.passkey", pk_cfg, mc), pk_cfg,
                               pk, ext.pk_lengths, ext.pk_ft_steps, ext.ft_len))
            for job, base_cfg, scoring, lens, steps, max_len in models:
                add(job, base_cfg, scoring, lens, entry=enc)
                for name, method, ft_cfg, ft_jobs in extension.finetunes(
                        config, ext, model=job.model, cfg=base_cfg, mc=mc,
                        base_fp=job.fingerprint, steps=steps, max_len=max_len):
                    add(ft_jobs[-1], ft_cfg, scoring, lens, entry=enc, before=ft_jobs[:-1],
                        tuned=(method, steps, ext.ft_len), zero_shot=())
    return Plan(workdir=os.path.abspath(workdir), config=config, encodings=encodings,
                scalings=scaling_names, seeds=seeds, settings=ext, train_len=train_len,
                eval_lens=eval_lens,
                eval_num_tokens=num_tokens, train_configs=train_configs,
                model_configs=model_configs, jobs=tuple(jobs))

