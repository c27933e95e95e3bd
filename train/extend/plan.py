"""The extension study's plan: a pure function from a config to the list of jobs.

    make_plan(config, workdir) -> Plan

For each model (config.models, each described in config.model.<name>: its file, its context C,
its rotary dim, whether its tokenizer wants BOS) and each method (`none` and the RoPE scaling
methods of the registry that have a `stretch` rule, `train.study.scalings.methods()`), at each
length n of config.lengths ('C/4', 'C', '2C', '4C' or ints):

  ppl      one forward over the first n + 1 tokens of a text (config.texts): the loss at every
           position, reported over the position buckets of `measure.bucket_edges`
  passkey  config.passkey.trials prompts of n tokens (depths and keys), greedy decoding

A method is evaluated at n > C only, with factor n / C and the registry's stretch rule (the
scaling dict as Hugging Face writes it): at n <= C every method has factor 1, the identity.
`none` is evaluated once per text at the longest length: with causal attention the first m
positions of that forward ARE the forward at m, so its prefix perplexities give `none` at every
shorter length. Passkey prompts differ by length, so `none` has a passkey job at every length.

Nothing here loads a model or touches a file; errors (TypeError / ValueError) name the key.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from posenc_jax import checks
from posenc_jax.encodings import rope_scaling
from train.extend import prompts, texts
from train.study import scalings
from train.study.jobs import NO_SCALING, fingerprint


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """One (model, method, length, measure). `scaling` is the rope_scaling dict as JSON ('null'
    for none); `factor` is n / C (1.0 for none)."""

    kind: ClassVar[str] = ""
    model: str
    method: str
    length: int
    context: int
    factor: float
    scaling: str
    fingerprint: str

    @property
    def rope_scaling(self) -> dict | None:
        return json.loads(self.scaling)

    @property
    def length_dependent(self) -> bool:
        """The scaling's frequencies change with the length (the registry says)."""
        return rope_scaling.is_length_dependent(self.rope_scaling)

    def row(self) -> dict[str, Any]:
        return {"model": self.model, "method": self.method, "length": self.length,
                "context": self.context, "factor": self.factor, "fingerprint": self.fingerprint}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PplJob(Job):
    kind: ClassVar[str] = "ppl"
    text: str
    prefixes: tuple[int, ...] = ()   # shorter planned lengths read from this forward (none)

    @property
    def name(self) -> str:
        return f"{self.model}+{self.method}@{self.length}.ppl.{self.text}"

    def row(self) -> dict[str, Any]:
        return {**super().row(), "text": self.text}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PasskeyJob(Job):
    kind: ClassVar[str] = "passkey"
    depths: tuple[float, ...]
    keys: tuple[str, ...]
    max_new_tokens: int

    @property
    def name(self) -> str:
        return f"{self.model}+{self.method}@{self.length}.passkey"

    @property
    def trials(self) -> int:
        return len(self.depths) * len(self.keys)


@dataclasses.dataclass(frozen=True)
class Plan:
    workdir: str
    config: Any
    models: tuple[str, ...]
    methods: tuple[str, ...]
    contexts: Mapping[str, int]
    lengths: Mapping[str, tuple[int, ...]]
    jobs: tuple[Job, ...]

    def of_kind(self, kind: str) -> list[Job]:
        return [j for j in self.jobs if j.kind == kind]


def all_methods() -> tuple[str, ...]:
    """'none' and every registry method with a stretch rule, in the registry's order."""
    return (NO_SCALING, *scalings.methods())


def parse_names(value: Any, *, what: str, valid) -> tuple[str, ...]:
    """A comma-separated string (or 'all') of names from `valid`."""
    if not isinstance(value, str):
        raise TypeError(f"config.{what} must be a str, got {type(value).__name__}: {value!r}")
    if value.strip() == "all":
        return tuple(valid)
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise ValueError(f"config.{what}={value!r}: unknown {unknown or 'empty'}; valid: "
                         f"{', '.join(valid)} (or 'all')")
    return tuple(dict.fromkeys(names))


def length(raw: str, *, context: int) -> int:
    """'C', '4C', '4*C', 'C/4' or an int -> tokens."""
    text = raw.strip().replace(" ", "")
    if text.isdigit():
        value = int(text)
    else:
        found = re.fullmatch(r"(\d*)\*?C(?:/(\d+))?", text)
        if not found:
            raise ValueError(f"length {raw!r} must be an int or 'C', '2C', 'C/4'")
        value = int(found.group(1) or 1) * context // int(found.group(2) or 1)
    if value < 2:
        raise ValueError(f"length {raw!r} = {value} tokens must be >= 2")
    return value


def parse_lengths(spec: str, *, context: int) -> tuple[int, ...]:
    if not isinstance(spec, str):
        raise TypeError(f"config.lengths must be a str, got {type(spec).__name__}: {spec!r}")
    return tuple(sorted({length(p, context=context) for p in spec.split(",") if p.strip()}))


def _scaling(method: str, n: int, context: int, rotary_dim: int, overrides) -> dict | None:
    if method == NO_SCALING:
        return None
    return scalings.scaling_config(method, factor=n / context, train_len=context,
                                   rotary_dim=rotary_dim,
                                   overrides=(overrides or {}).get(method))


def model_jobs(config, name: str, methods: tuple[str, ...]
               ) -> tuple[int, tuple[int, ...], list[Job]]:
    """(context, lengths, jobs) of one model."""
    spec = config.model[name]
    context = checks.positive_int(f"model.{name}.context", spec.context)
    rotary_dim = checks.positive_int(f"model.{name}.rotary_dim", spec.rotary_dim)
    lengths = parse_lengths(config.lengths, context=context)
    pk_lengths = parse_lengths(spec.get("passkey_lengths") or config.passkey.lengths
                               or config.lengths, context=context)
    text_names = parse_names(config.texts, what="texts", valid=texts.TEXTS)
    pk = config.passkey
    depths = tuple(float(d) for d in str(pk.depths).split(",") if d.strip())
    keys = tuple(prompts.make_keys(int(pk.keys_per_depth), digits=int(pk.digits),
                                   seed=int(pk.seed)))
    overrides = config.get("scaling_overrides")
    overrides = overrides.to_dict() if hasattr(overrides, "to_dict") else overrides
    common = {"file": spec.file, "dtype": config.dtype, "attention": config.attention,
              "add_bos": bool(spec.add_bos)}
    jobs: list[Job] = []
    for method in methods:
        ppl_at = [max(lengths)] if method == NO_SCALING else [n for n in lengths if n > context]
        pk_at = list(pk_lengths) if method == NO_SCALING else [n for n in pk_lengths
                                                                  if n > context]
        for n in sorted(set(ppl_at) | set(pk_at)):
            sc = _scaling(method, n, context, rotary_dim, overrides)
            base = {"model": name, "method": method, "length": n, "context": context,
                    "factor": n / context if sc else 1.0,
                    "scaling": json.dumps(sc, sort_keys=True)}
            if n in ppl_at:
                prefixes = tuple(m for m in lengths if m < n) if method == NO_SCALING else ()
                for text in text_names:
                    key = {**common, **base, "text": text, "prefixes": prefixes}
                    jobs.append(PplJob(**base, text=text, prefixes=prefixes,
                                       fingerprint=fingerprint(key)))
            if n in pk_at and bool(pk.enabled) and depths and keys:
                key = {**common, **base, "depths": depths, "keys": keys,
                       "new": int(pk.max_new_tokens)}
                jobs.append(PasskeyJob(**base, depths=depths, keys=keys,
                                       max_new_tokens=int(pk.max_new_tokens),
                                       fingerprint=fingerprint(key)))
    return context, lengths, jobs


def make_plan(config, workdir: str) -> Plan:
    """Checks `config` and lists the jobs (model by model, method by method, length up)."""
    models = tuple(n.strip() for n in str(config.models).split(",") if n.strip())
    unknown = [m for m in models if m not in config.model]
    if unknown or not models:
        raise ValueError(f"config.models={config.models!r}: {unknown or 'empty'} not in "
                         f"config.model ({', '.join(config.model)})")
    methods = parse_names(config.methods, what="methods", valid=all_methods())
    contexts, lengths, jobs = {}, {}, []
    for name in models:
        contexts[name], lengths[name], more = model_jobs(config, name, methods)
        jobs += more
    return Plan(workdir=os.path.abspath(workdir), config=config, models=models,
                methods=methods, contexts=contexts, lengths=lengths, jobs=tuple(jobs))
