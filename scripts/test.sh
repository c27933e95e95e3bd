#!/usr/bin/env bash
# The whole test suite: property tests of every encoding, the model, sharded training
# (8 fake CPU devices, two local processes), the study, and every notebook executed.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
POSENC_EXTRAS=dev source "$(dirname "$0")/_venv.sh"
# Two workers (pytest-xdist): the suite is ~1,100 tests, and CI's machine has 2 cores.
# PYTEST_WORKERS=0 runs everything in this one process.
exec python -m pytest tests notebooks --nbmake --nbmake-timeout=120 -q \
  -n "${PYTEST_WORKERS:-2}" "$@"
