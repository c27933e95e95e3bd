#!/usr/bin/env bash
# The whole test suite: property tests of every encoding, the model, sharded training
# (8 fake CPU devices, two local processes), the study, and every notebook executed.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
POSENC_EXTRAS=dev source "$(dirname "$0")/_venv.sh"
# The real-model tests read two GGUF files (scripts/fetch_pretrained.sh: seconds once cached).
# POSENC_PRETRAINED_FETCH=0 skips the fetch; those tests then skip, naming the folder.
export POSENC_PRETRAINED_DIR="${POSENC_PRETRAINED_DIR:-$root/.pretrained}"
if [ "${POSENC_PRETRAINED_FETCH:-1}" != 0 ]; then
  bash "$root/scripts/fetch_pretrained.sh" "$POSENC_PRETRAINED_DIR"
fi
# Two workers (pytest-xdist): the suite is ~1,100 tests, and CI's machine has 2 cores.
# PYTEST_WORKERS=0 runs everything in this one process.
exec python -m pytest tests notebooks --nbmake --nbmake-timeout=120 -q \
  -n "${PYTEST_WORKERS:-2}" "$@"
