"""The tally study's plan: a pure function from its config to frozen jobs."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar

from posenc_jax import checks
from train.engine import lengths, names, scalings
from train.engine.store import fingerprint


@dataclasses.dataclass(frozen=True, kw_only=True)
class WavelengthJob:
    kind: ClassVar[str] = "wavelength"
    method: str
    length: int
    base: int
    rotary_dim: int
    fingerprint: str

    @property
    def model(self) -> str:   # the unit a worker would take: one per method
        return self.method

    @property
    def name(self) -> str:
        return f"{self.method}@{self.length}"


@dataclasses.dataclass(frozen=True)
class Plan:
    workdir: str
    config: Any
    jobs: tuple[WavelengthJob, ...]


def make_plan(config, workdir: str) -> Plan:
    base = checks.positive_int("config.base", config.base)
    rotary_dim = checks.positive_int("config.rotary_dim", config.rotary_dim)
    methods = names.names(config.methods, key="config.methods", valid=scalings.all_methods(),
                          allow_all=True, required=True)
    ns = lengths.lengths(config.lengths, base="B", value=base, key="config.lengths")
    jobs = tuple(WavelengthJob(method=m, length=n, base=base, rotary_dim=rotary_dim,
                               fingerprint=fingerprint([m, n, base, rotary_dim]))
                 for m in methods for n in ns)
    return Plan(workdir=os.path.abspath(workdir), config=config, jobs=jobs)
