#!/usr/bin/env bash
# The whole test suite: property tests of every encoding, the model, sharded training
# (8 fake CPU devices, two local processes), the study, and every notebook executed.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
POSENC_EXTRAS=dev source "$(dirname "$0")/_venv.sh"
exec python -m pytest tests notebooks --nbmake --nbmake-timeout=60 -q "$@"
