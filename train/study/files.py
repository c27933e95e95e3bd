"""Every file of a study workdir, named here and only here, and how each is written.

    <workdir>/<model>/                  one trained model (the trainer's workdir: checkpoints,
                                        metrics.jsonl) and MARKER, the study's note on it
    <workdir>/evals/<job name>.json     one finished evaluation (a result row), reused on rerun
    <workdir>/results.csv               every result row          (written by `report`)
    <workdir>/report.md                 tables and method notes   (written by `report`)
    <workdir>/extrapolation.png         perplexity against length (written by `report`)
    <workdir>/passkey.csv               every passkey row          (written by `report`)
    <workdir>/passkey.png               passkey accuracy against length (`report`)
    <workdir>/timings.json              one record per invocation of the study

Every write is atomic (a temporary file, then `os.replace`), so a killed study never leaves a
half-written file that a rerun would trust.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

MARKER = "study_train.json"  # in a model's directory: {fingerprint, finished, train_seconds...}
EVALS = "evals"
RESULTS = "results.csv"
REPORT = "report.md"
PLOT = "extrapolation.png"
PASSKEY = "passkey.csv"
PASSKEY_PLOT = "passkey.png"
TIMINGS = "timings.json"


@dataclasses.dataclass(frozen=True)
class Workdir:
    """The paths of one study's workdir (an absolute path; nothing is created here)."""

    root: str

    def model_dir(self, model: str) -> str:
        return os.path.join(self.root, model)

    def marker(self, model: str) -> str:
        return os.path.join(self.root, model, MARKER)

    def job(self, name: str) -> str:
        """Where the finished job called `name` keeps its result."""
        return os.path.join(self.root, EVALS, f"{name}.json")

    evals = property(lambda self: os.path.join(self.root, EVALS))
    results = property(lambda self: os.path.join(self.root, RESULTS))
    report = property(lambda self: os.path.join(self.root, REPORT))
    plot = property(lambda self: os.path.join(self.root, PLOT))
    passkey = property(lambda self: os.path.join(self.root, PASSKEY))
    passkey_plot = property(lambda self: os.path.join(self.root, PASSKEY_PLOT))
    timings = property(lambda self: os.path.join(self.root, TIMINGS))


def read_json(path: str) -> Any:
    """The JSON value in `path`, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, value: Any) -> None:
    write_text(path, json.dumps(value, indent=1, sort_keys=True, default=str))


def write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
