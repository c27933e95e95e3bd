#!/usr/bin/env bash
# The whole test suite: property tests of every encoding, the model, sharded training
# (8 fake CPU devices, two local processes), the study, and every notebook executed.
# Usage: bash scripts/test.sh [--quick] [extra pytest args]
#   --quick: the developer's loop (tests marked neither `slow` nor `multiprocess`, no
#   notebooks): a few minutes on two cores once .jax_cache/ is warm. CI runs everything.
# Every run prints its 25 slowest tests at the end (--durations=25), so a regression shows
# in CI's log. Compiled programs are kept in .jax_cache/ (tests/conftest.py says why that is
# safe; POSENC_TEST_COMPILE_CACHE=0 turns it off, `rm -rf .jax_cache` empties it).
set -euo pipefail
POSENC_EXTRAS=dev source "$(dirname "$0")/_venv.sh"
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
# The real-model tests read two GGUF files (scripts/fetch_pretrained.sh: seconds once cached).
# POSENC_PRETRAINED_FETCH=0 skips the fetch; those tests then skip, naming the folder.
export POSENC_PRETRAINED_DIR="${POSENC_PRETRAINED_DIR:-$root/.pretrained}"
if [ "$quick" = 0 ] && [ "${POSENC_PRETRAINED_FETCH:-1}" != 0 ]; then
  bash "$root/scripts/fetch_pretrained.sh" "$POSENC_PRETRAINED_DIR"
fi
# Two workers (pytest-xdist): the suite is ~1,900 tests, and CI's machine has 2 cores.
# Whole files go to a worker (loadfile), the slowest first (FIRST in tests/conftest.py: a
# module's fixtures are built once, and no long file starts last). PYTEST_WORKERS=0 runs
# everything in this one process.
dist=()
if [ "${PYTEST_WORKERS:-2}" != 0 ]; then dist=(--dist loadfile --no-loadscope-reorder); fi
if [ "$quick" = 1 ]; then
  exec python -m pytest tests -q -n "${PYTEST_WORKERS:-2}" "${dist[@]}" --durations=25 \
    -m "not slow and not multiprocess" "$@"
fi
exec python -m pytest tests notebooks --nbmake --nbmake-timeout=120 -q \
  -n "${PYTEST_WORKERS:-2}" "${dist[@]}" --durations=25 "$@"
