"""The tally study's report: results.csv and report.md."""

from __future__ import annotations

import os

from train.engine.output import csv_text
from train.engine.store import write_text


def write_all(plan, results: dict, timings: list) -> list[str]:
    rows = list(results.values())
    paths = [os.path.join(plan.workdir, f) for f in ("results.csv", "report.md")]
    write_text(paths[0], csv_text(rows, ("method", "length", "wavelength")))
    lines = ["# Longest RoPE wavelength by scaling method", "", "| method | length | tokens |",
             "|---|---|---|"] + [f"| {r['method']} | {r['length']} | {r['wavelength']:.0f} |"
                                 for r in rows]
    write_text(paths[1], "\n".join(lines + ["", f"{len(timings)} invocation(s)"]) + "\n")
    return paths
