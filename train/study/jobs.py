"""The study's jobs: small frozen dataclasses, one class per kind of work.

A job says what to do, never how: `plan.make_plan` lists them, `execute.RUNNERS[job.kind]`
executes one (the engine, `train.engine`, stores its result), `report` turns the results into
files. Every job has

    kind         ClassVar: which runner executes it ("train", "eval", ...)
    model        the model it trains or reads: its directory under the workdir
    fingerprint  what its result depends on (`train.engine.store.fingerprint`); a stored
                 result with another fingerprint is redone
    flops, compiles   its cost, for the time estimate (`Plan.estimate`: FLOPs at the rate
                 `config[rate_key]`, `estimate_gflops` unless a kind runs at its own)
    base         (a fine-tune) the model it starts from: the engine's workers wait for its
                 training
    name         a file-name-safe id, unique in a plan

To add a kind of job: a dataclass here (frozen, kw_only, with its `kind`), a function that
plans it in `plan`, and one that runs it in `runner` (registered in `RUNNERS`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

from train.engine.store import fingerprint

# Keys of the train config that do not change the trained weights (beyond float rounding).
_NOT_FINGERPRINTED = ("log_every_steps", "checkpoint_every_steps", "checkpoints_to_keep",
                      "async_checkpointing", "eval", "eval_every_steps", "mesh",
                      "logical_axis_rules")


def train_identity(cfg) -> dict[str, Any]:
    """What a training's weights depend on: its config minus logging and placement keys, as
    JSON values (the study's marker stores it, so a changed key can be named)."""
    kept = {k: v for k, v in cfg.to_dict().items() if k not in _NOT_FINGERPRINTED}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def train_fingerprint(cfg) -> str:
    """The fingerprint of `train_identity(cfg)`."""
    return fingerprint(train_identity(cfg))


_ABSENT = object()


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(_flat(v, f"{prefix}.{k}"))
    return out


def config_diff(there: dict, here: dict, prefix: str = "config.train") -> list[str]:
    """The keys two `train_identity` dicts differ in, as the trainer names them:
    ["config.train.model.embed_dim=32 there, 64 here", ...] (sorted; a key one side lacks
    reads `<absent>`)."""
    a, b = _flat(there, prefix), _flat(here, prefix)

    def show(side, key):
        return repr(side[key]) if key in side else "<absent>"

    return [f"{k}={show(a, k)} there, {show(b, k)} here"
            for k in sorted(set(a) | set(b)) if a.get(k, _ABSENT) != b.get(k, _ABSENT)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """The fields every job has; see the module docstring."""

    kind: ClassVar[str] = ""
    rate_key: ClassVar[str] = "estimate_gflops"
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
class FinetuneJob(TrainJob):
    """Train `model` with `plan.train_configs[model]` starting from `base`'s checkpoint at
    `step` (`train.finetune`): the pretrained state is its first checkpoint. `search`: the
    searched method's fine-tune takes the factors of that search's result at run time
    ((name, fingerprint); `train.study.searched.tuned_config`)."""

    kind: ClassVar[str] = "finetune"
    base: str
    step: int
    search: tuple = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalJob(Job):
    """Evaluate the trained `model` at `eval_len`, rebuilt with `overrides` (a frozen dict of
    TransformerConfig fields: a scaled encoding, the eval attention); `note` means n/a;
    `search`: the searched method's factors come from that job's result at run time.
    `finetune_steps`, `finetune_len`: how `model` was fine-tuned (0, 0: it was not)."""

    kind: ClassVar[str] = "eval"
    encoding: str
    scaling: str
    train_len: int
    eval_len: int
    seed: int = 0
    finetune_steps: int = 0
    finetune_len: int = 0
    overrides: Any = ()
    note: str = ""
    search: tuple = ()   # (name, fingerprint) of the search whose factors it evaluates

    @property
    def name(self) -> str:
        return f"{self.model}+{self.scaling}@{self.eval_len}"

    def row(self) -> dict[str, Any]:
        """The result row's identifying columns (results.csv adds loss, ppl, ...)."""
        return {"encoding": self.encoding, "scaling": self.scaling,
                "finetune_steps": self.finetune_steps, "finetune_len": self.finetune_len,
                "seed": self.seed, "train_len": self.train_len, "eval_len": self.eval_len,
                "fingerprint": self.fingerprint}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PasskeyJob(EvalJob):
    """Passkey retrieval of the trained `model` on `trials` documents of `eval_len` bytes
    (`train.datasets.passkey.eval_set(eval_len, trials=, seed=eval_seed)`)."""

    kind: ClassVar[str] = "passkey"
    trials: int
    eval_seed: int = 0

    def row(self) -> dict[str, Any]:
        return {**super().row(), "trials": self.trials}
