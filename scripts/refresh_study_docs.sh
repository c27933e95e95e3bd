#!/usr/bin/env bash
# Regenerates the committed study results in docs/study/ in one command: the default study
# with three seeds (0, 1, 2) in runs/study_docs (resumable: rerun to continue), then its
# outputs copied to docs/study/. Extra arguments go to the study, e.g.
#   bash scripts/refresh_study_docs.sh                       # seeds 0,1,2 (about 3x the default)
#   bash scripts/refresh_study_docs.sh --config.seeds=0      # one seed, as `scripts/study.sh`
set -euo pipefail
cd "$(dirname "$0")/.."
workdir="${STUDY_DOCS_WORKDIR:-runs/study_docs}"
bash scripts/study.sh "$workdir" --config.seeds=0,1,2 "$@"
mkdir -p docs/study
rm -rf docs/study/seed1 docs/study/noise.md   # superseded: the seeds are in every table now
for f in results.csv passkey.csv report.md extrapolation.png passkey.png; do
  if [ -f "$workdir/$f" ]; then cp "$workdir/$f" docs/study/; fi
done
echo "docs/study: $(ls docs/study | tr '\n' ' ')"
