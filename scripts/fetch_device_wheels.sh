#!/usr/bin/env bash
# Wheels that scripts/device_check.sh needs on the GPU machine and its image lacks (it has
# jax, flax, optax, orbax-checkpoint, chex, numpy, matplotlib, pytest, hypothesis, torch,
# transformers and their dependencies, and no network). Run HERE, with network; the folder
# (ignored by git) travels with the device run, e.g. the run tool's carry=[".device_wheels"].
#   bash scripts/fetch_device_wheels.sh [dir]          # default .device_wheels, < 64 MiB
# Only names our code imports at run time, each pinned to the version our CI tests, for
# CPython 3.12 on manylinux x86_64, no dependencies resolved (named explicitly instead).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.device_wheels}"
PY="${PYTHON:-$(command -v python3)}"
WHEELS=(
  ml_collections==1.1.0            # configs
  tensorflow-datasets==4.9.10      # the byte corpus (array_record format, no TensorFlow)
  tensorflow-metadata==1.21.0 array_record==0.8.6 immutabledict==4.3.1
  toml==0.10.2 wrapt==2.5.2 googleapis-common-protos==1.76.0 cloudpickle==3.1.3
  dm-tree==0.1.10 importlib_resources==7.1.0 simple_parsing==0.1.9 docstring-parser==0.18.0
  termcolor==3.3.0 psutil==7.2.2   # tensorflow-datasets' run-time imports
  tqdm==4.70.1                     # progress (usually there via transformers)
  tensorboardX==2.6.5              # training's TensorBoard event files (train.tensorboard_log)
  gguf==0.19.0                     # posenc_jax.pretrained's GGUF reader (numpy, pyyaml, requests: there)
)
mkdir -p "$dir"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
  --dest "$dir" "${WHEELS[@]}"
# Pure-Python packages published only as source: built into a wheel here.
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$dir" promise==2.3
size=$(du -sm "$dir" | cut -f1)
echo "$(ls "$dir" | wc -l) wheels, ${size} MiB in $dir"
if [ "$size" -gt 64 ]; then echo "over the 64 MiB that can travel" >&2; exit 1; fi
