#!/usr/bin/env bash
# The device run in two calls, for a model file larger than what one call may carry (64 MiB of
# working tree and carried paths: SmolLM2's GGUF alone is 98 MB). The machine stays warm
# between two calls made back to back, and /tmp survives on it, so:
#   bash scripts/device_split.sh prepare      # HERE: .device_carry/{a,b} (git-ignored)
#   call 1, carry [".device_carry"]:  bash scripts/device_split.sh a    # first part + wheels;
#       runs the sections that need no model file (tests, rope, attention, train, kernel)
#   call 2, carry [".device_carry"]:  bash scripts/device_split.sh b    # second part; joins,
#       checks the sha256 and runs extend_2c, longrope_2c, extend_4c (benchmarks/device_extend.py)
#   bash scripts/device_split.sh restore      # HERE, after the calls: the blanked files back
# A call carries at most 64 MiB with the working tree (17 MB tracked): prepare blanks the tracked
# files over 150 kB under tests/data and docs (no section reads them; `git checkout` restores
# them, and `restore` does that), so half the model and the tree fit in one call.
# Each call leaves one tarball in $OUT (OUT/<step>.tgz: device_check.{json,md}, the sections'
# JSON, the extension study's results and logs). If the machine went back between the calls,
# step b finds no first part and says so; it does not guess. Sections: $DEVICE_SPLIT_A and
# $DEVICE_SPLIT_B override the lists. prepare needs .pretrained (scripts/fetch_pretrained.sh)
# and .device_wheels (scripts/fetch_device_wheels.sh). DEVICE_SPLIT_SMOKE=1: the sections in
# their CPU smoke mode (the dry run here).
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
CUT=44000000          # bytes in the first part; the rest goes in the second
LIB="${TMPDIR:-/tmp}/posenc_device_pylib"
PARTS="${TMPDIR:-/tmp}/posenc_device_parts"
step="${1:?usage: bash scripts/device_split.sh prepare|a|b|restore}"

run_sections() {  # $1: the sections, $2: the tarball's name
  local dir="${TMPDIR:-/tmp}/device_check_$2"
  rm -rf "$dir"
  if [ -d "$LIB" ]; then export PYTHONPATH="$LIB${PYTHONPATH:+:$PYTHONPATH}"; fi
  DEVICE_CHECK_SECTIONS="$1" PYTHONUNBUFFERED=1 bash scripts/device_check.sh \
    ${DEVICE_SPLIT_SMOKE:+--smoke} "$dir" \
    2>&1 | tee "$dir.log"
  cp "$dir.log" "$dir/run.log" 2>/dev/null
  if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/$2.tgz" -C "$dir" . && echo "device_split: wrote $OUT/$2.tgz"
  fi
}

case "$step" in
  prepare)
    rm -rf .device_carry && mkdir -p .device_carry/a .device_carry/b
    grep -qx '/.device_carry/' .git/info/exclude 2>/dev/null \
      || echo '/.device_carry/' >> .git/info/exclude
    head -c "$CUT" ".pretrained/$MODEL" > .device_carry/a/part1
    tail -c +"$((CUT + 1))" ".pretrained/$MODEL" > .device_carry/b/part2
    sha256sum ".pretrained/$MODEL" | cut -d' ' -f1 > .device_carry/b/sha256
    cp .device_wheels/*.whl .device_carry/a/
    # step b installs these itself when step a's folder is gone (a fresh machine)
    for w in ml_collections tensorboardx tqdm gguf; do
      cp .device_wheels/${w}-*.whl .device_carry/b/ 2>/dev/null
    done
    git ls-files tests/data docs | while read -r f; do
      [ "$(stat -c %s "$f")" -gt 150000 ] && echo "$f"; done > .device_carry/blanked
    while read -r f; do : > "$f"; done < .device_carry/blanked
    echo "device_split: blanked $(wc -l < .device_carry/blanked) tracked files (restore: bash $0 restore)"
    du -sh .device_carry/a .device_carry/b ;;
  restore)
    git checkout -- $(cat .device_carry/blanked) && echo "device_split: restored" ;;
  a)
    mkdir -p "$PARTS" && cp .device_carry/a/part1 "$PARTS/" || exit 1
    "${PYTHON:-python3}" -m pip install --quiet --no-index --no-deps --target "$LIB" .device_carry/a/*.whl \
      || echo "device_split: installing the wheels failed"
    nvidia-smi -L 2>/dev/null
    run_sections "${DEVICE_SPLIT_A:-tests,rope,attention,train,kernel}" a ;;
  b)
    if [ ! -d "$LIB" ]; then
      "${PYTHON:-python3}" -m pip install --quiet --no-index --no-deps --target "$LIB" .device_carry/b/*.whl
    fi
    if [ ! -f "$PARTS/part1" ]; then
      echo "device_split: no first part in $PARTS (a fresh machine?): run step a first"
      exit 3
    fi
    mkdir -p .pretrained
    cat "$PARTS/part1" .device_carry/b/part2 > ".pretrained/$MODEL"
    if [ "$(sha256sum ".pretrained/$MODEL" | cut -d' ' -f1)" != "$(cat .device_carry/b/sha256)" ]; then
      echo "device_split: .pretrained/$MODEL does not match its sha256 after joining"
      exit 4
    fi
    run_sections "${DEVICE_SPLIT_B:-extend_2c,longrope_2c,extend_4c}" b ;;
  *) echo "device_split: unknown step '$step' (prepare, a, b or restore)"; exit 2 ;;
esac
