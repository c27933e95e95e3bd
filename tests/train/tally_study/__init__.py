"""A minimal third study built from the engine (`train.engine`) in three small files: `plan`
(config -> jobs), `runner` (one runner and the study record), `report` (results -> files).

For each RoPE scaling method and length n (over the base B, `config.base`), a job computes
the scaled inverse frequencies' longest wavelength at factor n / B: cheap, deterministic, and
enough to prove the engine (store, resume, lock, signals, progress, timings) end to end.
"""
