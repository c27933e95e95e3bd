"""The study's jobs: small frozen dataclasses, one class per kind of work.

A job says what to do, never how: `plan.make_plan` lists them, `runner.RUNNERS[job.kind]`
executes one, `report` turns the results into files. Every job has

    kind         ClassVar: which runner executes it ("train", "eval", ...)
    model        the model it trains or reads: its directory under the workdir
    fingerprint  what its result depends on; a stored result with another fingerprint is redone
    flops, compiles   its cost, for the time estimate (`Plan.estimate`)
    name         a file-name-safe id, unique in a plan

To add a kind of job: a dataclass here (frozen, kw_only, with its `kind`), a function that
plans it in `plan`, and one that runs it in `runner` (registered in `RUNNERS`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, ClassVar

NO_SCALING = "none"  # the `scaling` of an evaluation with the encoding as trained


def fingerprint(value: Any) -> str:
    """A short hash of a JSON-able value (keys sorted)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """The fields every job has; see the module docstring."""

    kind: ClassVar[str] = ""
    model: str
    fingerprint: str
    flops: float = 0.0
    compiles: int = 0

    @property
    def name(self) -> str:
        return self.model


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainJob(Job):
    """Train `model` with `plan.train_configs[model]` (resuming from its checkpoint)."""

    kind: ClassVar[str] = "train"


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalJob(Job):
    """Evaluate the trained `model` at `eval_len`, rebuilt with `overrides` (a frozen dict of
    TransformerConfig fields: a scaled encoding, the eval attention); `note` means n/a."""

    kind: ClassVar[str] = "eval"
    encoding: str
    scaling: str
    train_len: int
    eval_len: int
    overrides: Any = ()
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.model}+{self.scaling}@{self.eval_len}"

    def row(self) -> dict[str, Any]:
        """The result row's identifying columns (results.csv adds loss, ppl, ...)."""
        return {"encoding": self.encoding, "scaling": self.scaling, "train_len": self.train_len,
                "eval_len": self.eval_len, "fingerprint": self.fingerprint}
