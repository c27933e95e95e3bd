"""What a study's report writes with: CSV text, figures, the machine's description.

    csv_text(rows, columns)     CSV with a header; floats as %.6g, missing cells empty
    save_figure(fig, path)      a matplotlib Figure written atomically (tight layout)
    machine()                   CPU, load, Python / JAX / Flax versions, devices (markdown)
"""

from __future__ import annotations

import csv
import io
import os
import platform
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import flax
import jax


def cell(value: Any) -> Any:
    """A CSV cell: floats as %.6g, everything else as it is."""
    return f"{value:.6g}" if isinstance(value, float) else value


def csv_text(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """The rows (in the order given) under a header of `columns`; other keys are dropped."""
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: cell(row.get(k, "")) for k in columns})
    return out.getvalue()


def save_figure(fig, path: str) -> None:
    """Lays out `fig` and writes it to `path` (a temporary file, then `os.replace`)."""
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp)
    os.replace(tmp, path)


def machine() -> str:
    """CPU model and cores, load, Python/JAX/Flax versions and devices, as markdown lines."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    devices = jax.devices()
    return "\n".join([
        (f"- CPU: {cpu}, {os.cpu_count()} logical cores; load average (1, 5, 15 min) at "
         f"report time: {load}"),
        f"- {platform.platform()}, Python {platform.python_version()}",
        (f"- jax {jax.__version__}, flax {flax.__version__}; {len(devices)} device(s): "
         f"{devices[0].platform} ({devices[0].device_kind})")])
