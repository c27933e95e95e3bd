#!/usr/bin/env bash
# The length-extrapolation study on the bundled corpus: trains every encoding at length L,
# evaluates from L/2 to 16L with and without each RoPE scaling method, and writes
# results.csv, report.md and extrapolation.png to the workdir (default runs/study).
# Usage: bash scripts/study.sh [workdir] [--config.key=value ...]
set -euo pipefail
POSENC_EXTRAS=train source "$(dirname "$0")/_venv.sh"
workdir="${1:-runs/study}"
shift || true
exec python -m train.study --config=configs/study.py --workdir="$workdir" "$@"
