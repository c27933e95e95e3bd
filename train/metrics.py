"""Run logging: `metrics.jsonl` in the workdir and a tqdm progress bar (process 0 only).

Each line of `metrics.jsonl` is one JSON object for one logged step: `step` (updates done),
`loss`, `learning_rate`, `grad_norm`, `tokens_per_sec`, and `eval/<len>/loss`,
`eval/<len>/ppl` when an evaluation ran at that step. A resumed run first drops the lines of
steps after its checkpoint, so the file always describes one uninterrupted run. The same
records go to TensorBoard event files in the workdir (`train.tensorboard_log`, same resume rule).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import jax
import tqdm

from train import tensorboard_log


def _clean(value: Any) -> Any:
    try:
        value = float(value) if not isinstance(value, (int, str, bool)) else value
    except (TypeError, ValueError):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    return value


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """The records of `workdir/metrics.jsonl` (an empty list if there is none); a torn last
    line (a process killed while writing it) is skipped."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


class MetricsLogger:
    """Appends records to metrics.jsonl and drives the progress bar; no-ops off process 0."""

    def __init__(self, workdir: str, *, start_step: int, total_steps: int, enabled=None,
                 progress: bool = True):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._bar = None
        self._events = None
        if not self.enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self._truncate_after(start_step)
        self._events = tensorboard_log.EventLog(workdir, start_step=start_step)
        if progress:
            self._bar = tqdm.tqdm(total=total_steps, initial=start_step, unit="step",
                                  dynamic_ncols=True, smoothing=0.1)

    def _truncate_after(self, step: int) -> None:
        """Drops records of steps > `step` (written by a run killed after its checkpoint)."""
        records = read_metrics(os.path.dirname(self.path))
        keep = [r for r in records if int(r.get("step", 0)) <= step]
        if len(keep) != len(records):
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in keep)
            os.replace(tmp, self.path)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._events.write(record)
        record = {k: _clean(v) for k, v in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        if self._bar is not None and "loss" in record:
            post = {"loss": f"{record['loss']:.4f}" if isinstance(record["loss"], float)
                    else record["loss"]}
            if "tokens_per_sec" in record:
                post["tok/s"] = f"{record['tokens_per_sec']:.3g}"
            self._bar.set_postfix(post, refresh=False)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def flush(self) -> None:
        """Puts the TensorBoard events on disk (metrics.jsonl is flushed at each write)."""
        if self._events is not None:
            self._events.flush()

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
