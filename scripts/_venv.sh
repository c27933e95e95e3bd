# Sourced by the scripts in this folder: makes ./.venv (Python >= 3.11) and installs the
# project with the extras named in $POSENC_EXTRAS, once per change of pyproject.toml.
# Safe to run twice: a second run finds the stamp and installs nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "posenc-jax needs Python >= 3.11; '$py' is $("$py" --version 2>&1). Set PYTHON=python3.11." >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
extras="${POSENC_EXTRAS:-dev}"
stamp=".venv/.installed-$(cat pyproject.toml | "$py" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])')-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[${extras}]"
  touch "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
