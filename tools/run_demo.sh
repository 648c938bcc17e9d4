#!/usr/bin/env bash
# tools/run_demo.sh - the quick-start job (`make run`): build, prepare the bundled fortunes
# dataset, train configs/demo.toml, print samples, and plot the run's metrics
# ($BUILD/demo/metrics.jsonl -> $BUILD/demo/loss.png, tools/plot.py). Dependencies are installed
# by `make run` (tools/install_deps.sh) before this runs.
#
# Uses ./train on a machine with an NVIDIA GPU and the CUDA toolkit, else ./train_cpu. Extra
# arguments are passed to the trainer as overrides, e.g. `make run ARGS=--train.steps=50`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 &&
   { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  make -j"$(nproc)" BUILD="$BUILD" all
  trainer=./train
else
  make -j"$(nproc)" BUILD="$BUILD" cpu
  trainer=./train_cpu
fi
BUILD="$BUILD" tools/prepare_fortunes.sh

data=$BUILD/data/fortunes
vocab=$(cat "$data/vocab_size")
out=$BUILD/demo
mkdir -p "$out"
rm -f "$out/metrics.jsonl"  # the trainer appends: start the demo's metrics afresh
echo "run_demo: $trainer configs/demo.toml (vocabulary $vocab)"
$trainer configs/demo.toml \
  --data.train="$data/fortunes_train_*.bin" --data.val="$data/fortunes_val_*.bin" \
  --data.tokenizer="$data/tokenizer.bin" --model.vocab_size="$vocab" \
  --log.metrics="$out/metrics.jsonl" "$@"
if [ -s "$out/metrics.jsonl" ]; then
  /usr/bin/python3 tools/plot.py "$out/metrics.jsonl" -o "$out/loss.png"
fi
