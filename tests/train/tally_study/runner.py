"""The tally study's runner and its record for the engine."""

from __future__ import annotations

import numpy as np

from posenc_jax.encodings import rope_scaling
from tally_study import report
from tally_study.plan import make_plan
from train.engine import record
from train.engine import run as engine
from train.engine.scalings import NO_SCALING, scaling_config


def run_wavelength(ctx, job) -> dict:
    """The longest wavelength (in tokens) of RoPE's frequencies scaled to job.length."""
    sc = None
    if job.method != NO_SCALING and job.length > job.base:
        sc = scaling_config(job.method, factor=job.length / job.base, train_len=job.base,
                            rotary_dim=job.rotary_dim)
    inv, _ = rope_scaling.frequencies(sc, rotary_dim=job.rotary_dim, base=10000.0,
                                      seq_len=job.length)
    return {"method": job.method, "length": job.length,
            "wavelength": float(2 * np.pi / np.min(np.asarray(inv)))}


RUNNERS = {"wavelength": run_wavelength}


def study() -> record.Study:
    return record.Study(name="tally", plan=make_plan, runners=dict(RUNNERS),
                        report=report.write_all)


def run(config, workdir: str, *, progress: bool = False) -> dict:
    return engine.run(study(), config, workdir, progress=progress)
