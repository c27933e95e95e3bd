"""Experiment configs, one file per experiment; each file's `get_config()` returns the whole run.

Files import the shared base as `from configs import default`, so run from the repository
root (as `python -m train ...` and `python -m train.study ...` need anyway).
"""
