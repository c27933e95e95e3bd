#!/usr/bin/env bash
# One prepared accelerator run (tests, RoPE bandwidth, attention table, train-step MFU, the
# exercise-5 study), about 8 minutes on one H200; --smoke: the same on CPU, tiny, < 3 min.
#   bash scripts/fetch_device_wheels.sh          # HERE, with network (once)
#   bash scripts/device_check.sh OUT             # on the GPU machine (carry .device_wheels)
#   bash scripts/device_check.sh --smoke OUT     # anywhere, CPU only
# Writes OUT/device_check.json and OUT/device_check.md (see benchmarks/device_check.py).
# Python: $PYTHON, else ./.venv/bin/python, else python3. Packages our code imports that the
# machine lacks are installed from .device_wheels into a private folder (never the system).
set -uo pipefail
cd "$(dirname "$0")/.."
smoke=()
if [ "${1:-}" = "--smoke" ]; then smoke=(--smoke); shift; fi
out="${1:?usage: bash scripts/device_check.sh [--smoke] OUT}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c "import ml_collections, tensorflow_datasets, array_record, tqdm" 2>/dev/null; then
  if compgen -G ".device_wheels/*.whl" >/dev/null; then
    lib="${TMPDIR:-/tmp}/posenc_device_pylib"
    "$PY" -m pip install --quiet --no-index --no-deps --target "$lib" .device_wheels/*.whl \
      || echo "warning: installing .device_wheels failed; sections that need them will say so"
    export PYTHONPATH="$lib${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "warning: packages missing and no .device_wheels/ (run scripts/fetch_device_wheels.sh)"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"
exec "$PY" benchmarks/device_check.py "${smoke[@]}" --out "$out"
