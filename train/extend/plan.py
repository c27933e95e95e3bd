"""The extension study's plan: a pure function from a config to the list of jobs.

    make_plan(config, workdir) -> Plan

    plan_of(settings, workdir) -> Plan         the same from `settings.read(config)`

For each model (config.models, each described in config.model.<name>: its file, whether its
tokenizer wants BOS; its context C and rotary dim read from the checkpoint by `settings`) and
each method (`none` and the RoPE scaling methods of the registry that have a `stretch` rule,
`train.engine.scalings.methods()`), at each length n of config.lengths ('C/4', 'C', '2C', '4C'
or ints, `train.engine.lengths`):

  ppl      one forward over the first n + 1 tokens of a text (config.texts): the loss at every
           position, reported over the position buckets of `measure.bucket_edges`
  passkey  config.passkey.trials prompts of n tokens (depths and keys), greedy decoding

A method is evaluated at n > C only, with factor n / C and the registry's stretch rule (the
scaling dict as Hugging Face writes it): at n <= C every method has factor 1, the identity.
`none` is evaluated once per text at the longest length: with causal attention the first m
positions of that forward ARE the forward at m, so its prefix perplexities give `none` at every
shorter length. Passkey prompts differ by length, so `none` has a passkey job at every length.

`plan_of` loads no model and touches no file; `settings.read` checks the config (TypeError /
ValueError naming the key) and reads each checkpoint's header, nothing more.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any, ClassVar

from posenc_jax.encodings import rope_scaling
from train.engine import scalings
from train.engine.scalings import NO_SCALING, scaling_config
from train.engine.store import fingerprint
from train.extend import settings as settings_lib

all_methods = scalings.all_methods  # what config.methods may name ('all': every one)


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
    settings: settings_lib.Settings
    jobs: tuple[Job, ...]

    @property
    def config(self) -> settings_lib.Settings:
        """What a worker process would rebuild the plan from (the engine's protocol)."""
        return self.settings

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.settings.models)

    @property
    def methods(self) -> tuple[str, ...]:
        return self.settings.methods

    @property
    def contexts(self) -> Mapping[str, int]:
        return {m.name: m.context for m in self.settings.models}

    @property
    def lengths(self) -> Mapping[str, tuple[int, ...]]:
        return {m.name: m.lengths for m in self.settings.models}

    def of_kind(self, kind: str) -> list[Job]:
        return [j for j in self.jobs if j.kind == kind]


def _scaling(method: str, n: int, model: settings_lib.Model, s: settings_lib.Settings
             ) -> dict | None:
    if method == NO_SCALING:
        return None
    return scaling_config(method, factor=n / model.context, train_len=model.context,
                          rotary_dim=model.rotary_dim, overrides=s.overrides(method))


def model_jobs(s: settings_lib.Settings, model: settings_lib.Model) -> list[Job]:
    """The jobs of one model, method by method, length up."""
    pk = s.passkey
    common = {"file": model.file, "dtype": s.dtype, "attention": s.attention,
              "add_bos": model.add_bos}
    jobs: list[Job] = []
    for method in s.methods:
        above = [n for n in model.lengths if n > model.context]
        ppl_at = [max(model.lengths)] if method == NO_SCALING else above
        pk_at = list(model.passkey_lengths) if method == NO_SCALING else [
            n for n in model.passkey_lengths if n > model.context]
        for n in sorted(set(ppl_at) | set(pk_at)):
            sc = _scaling(method, n, model, s)
            base = {"model": model.name, "method": method, "length": n,
                    "context": model.context, "factor": n / model.context if sc else 1.0,
                    "scaling": json.dumps(sc, sort_keys=True)}
            if n in ppl_at:
                prefixes = (tuple(m for m in model.lengths if m < n) if method == NO_SCALING
                            else ())
                for text in s.texts:
                    key = {**common, **base, "text": text, "prefixes": prefixes}
                    jobs.append(PplJob(**base, text=text, prefixes=prefixes,
                                       fingerprint=fingerprint(key)))
            if n in pk_at and pk.enabled:
                key = {**common, **base, "depths": pk.depths, "keys": pk.keys,
                       "new": pk.max_new_tokens}
                jobs.append(PasskeyJob(**base, depths=pk.depths, keys=pk.keys,
                                       max_new_tokens=pk.max_new_tokens,
                                       fingerprint=fingerprint(key)))
    return jobs


def plan_of(s: settings_lib.Settings, workdir: str) -> Plan:
    """The jobs of checked settings (model by model, method by method, length up)."""
    jobs = [job for model in s.models for job in model_jobs(s, model)]
    return Plan(workdir=os.path.abspath(workdir), settings=s, jobs=tuple(jobs))


def make_plan(config, workdir: str, *, inspect=settings_lib.checkpoint_facts) -> Plan:
    """Checks `config` (`settings.read`, each checkpoint's C and rotary dim from `inspect`)
    and lists the jobs."""
    return plan_of(settings_lib.read(config, inspect=inspect), workdir)
