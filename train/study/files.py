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

Every write is atomic (`train.engine.store`: a temporary file, then `os.replace`), so a killed
study never leaves a half-written file that a rerun would trust.
"""

from __future__ import annotations

import dataclasses
import os

from train.engine.store import TIMINGS

MARKER = "study_train.json"  # in a model's directory: {fingerprint, finished, train_seconds...}
EVALS = "evals"   # the engine's result store: one file per finished evaluation
RESULTS = "results.csv"
REPORT = "report.md"
PLOT = "extrapolation.png"
PASSKEY = "passkey.csv"
PASSKEY_PLOT = "passkey.png"


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
