"""TensorBoard event files in the workdir, beside `metrics.jsonl`: `tensorboard --logdir=WORKDIR`.

Written with tensorboardX (no TensorFlow; clu's `metric_writers` package imports TensorFlow on
import, and its only other TensorBoard writer needs torch). Tags: `train/loss`,
`train/learning_rate`, `train/grad_norm`, `train/tokens_per_sec`, `train/moe_aux_loss` (a MoE
model), and the evaluations' `eval/<len>/loss`, `eval/<len>/ppl`, each at the record's `step`.

Resuming: like `metrics.jsonl`, a run resumed from step S first drops the events of steps after
S from the existing event files (written by a run killed after its checkpoint; the events of
steps <= S are kept byte for byte), then appends in a new event file, so the files together
hold every logged step once. Events reach disk at `flush()` (the trainer calls it before each
checkpoint) and at `close()`.

`read_events(logdir)` / `read_scalars(logdir)` read the files back without TensorFlow: a TFRecord
reader (length, masked CRC-32C of the length, data, masked CRC of the data) over tensorboardX's
`Event` protobuf. A torn last record (a process killed while writing it) ends a file's events.
"""

from __future__ import annotations

import glob
import os
import struct
import time
from collections.abc import Iterator
from typing import Any

from tensorboardX import SummaryWriter
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

#: metrics.jsonl keys written under `train/`; keys with a `/` (the evaluations) keep their name.
TRAIN_KEYS = ("loss", "learning_rate", "grad_norm", "tokens_per_sec", "moe_aux_loss")
_PATTERN = "events.out.tfevents.*"


def event_files(logdir: str) -> list[str]:
    """The event files directly in `logdir`, in the order TensorBoard reads them (by name)."""
    return sorted(path for path in glob.glob(os.path.join(glob.escape(logdir), _PATTERN))
                  if not path.endswith(".tmp"))


def _records(path: str) -> Iterator[tuple[int, bytes]]:
    """(end offset, data) of each whole record of a TFRecord file, until a torn or bad one."""
    with open(path, "rb") as f:
        blob = f.read()
    at = 0
    while at + 12 <= len(blob):
        header = blob[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", blob[at + 8:at + 12])
        end = at + 12 + length + 4
        if header_crc != masked_crc32c(header) or end > len(blob):
            return
        data = blob[at + 12:at + 12 + length]
        if struct.unpack("<I", blob[end - 4:end])[0] != masked_crc32c(data):
            return
        yield end, data
        at = end


def _parse(data: bytes) -> event_pb2.Event:
    event = event_pb2.Event()
    event.ParseFromString(data)
    return event


def read_events(logdir: str) -> list[event_pb2.Event]:
    """Every `Event` of the event files in `logdir`, file after file (see `event_files`)."""
    return [_parse(data) for path in event_files(logdir) for _, data in _records(path)]


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value), ...] of the scalar summaries in `logdir`, in the files' order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for event in read_events(logdir):
        for value in event.summary.value:
            out.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
    return out


def truncate_after(logdir: str, step: int) -> None:
    """Drops the summaries of steps > `step` (and torn tails) from the event files in `logdir`.

    A file that changes is rewritten beside itself and moved into place (atomic); a file left
    with no summary is removed.
    """
    for path in event_files(logdir):
        keep, summaries, changed = [], 0, False
        size = os.path.getsize(path)
        end = 0
        start = 0
        for end, data in _records(path):
            event = _parse(data)
            if event.HasField("summary") and event.step > step:
                changed = True
            else:
                keep.append((start, end))
                summaries += event.HasField("summary")
            start = end
        changed = changed or end != size
        if not changed:
            continue
        if not summaries:
            os.remove(path)
            continue
        with open(path, "rb") as f:
            blob = f.read()
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.writelines(blob[a:b] for a, b in keep)
        os.replace(tmp, path)


def _tags(record: dict[str, Any]) -> Iterator[tuple[str, float]]:
    for key, value in record.items():
        tag = key if "/" in key else f"train/{key}" if key in TRAIN_KEYS else None
        if tag is None or isinstance(value, (str, bool)):
            continue
        try:
            yield tag, float(value)
        except (TypeError, ValueError):
            continue


class EventLog:
    """Scalars of the trainer's records as TensorBoard events in `logdir` (one run's writer).

    `start_step`: the step the run starts from (its checkpoint); events after it are dropped
    first (see the module docstring). The new file's name ends in the time in nanoseconds, so a
    run resumed within the same second never overwrites the previous run's file. The file is
    made at the first `write`: a run with nothing to train (already at its last step) adds none.
    """

    def __init__(self, logdir: str, *, start_step: int):
        os.makedirs(logdir, exist_ok=True)
        truncate_after(logdir, start_step)
        self.logdir = logdir
        self._writer: SummaryWriter | None = None

    def write(self, record: dict[str, Any]) -> None:
        """One metrics record (`step` plus values, as in metrics.jsonl) as scalar events."""
        step = int(record["step"])
        if self._writer is None:
            self._writer = SummaryWriter(logdir=self.logdir, max_queue=1000, flush_secs=60,
                                         filename_suffix=f".{time.time_ns()}")
        for tag, value in _tags(record):
            self._writer.add_scalar(tag, value, global_step=step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
