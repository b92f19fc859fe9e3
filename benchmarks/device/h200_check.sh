#!/usr/bin/env bash
# Run on the device machine (NVIDIA H200, PyTorch installed, no network) from the repo root:
#   bash benchmarks/device/h200_check.sh "$OUT"
# Installs gpuaudit from the working tree without dependencies from the network (they must be
# present already), then runs the four workloads and the sampler benchmark.
set -euo pipefail
out=${1:-${OUT:-/tmp/gpuaudit-h200}}
mkdir -p "$out"
nvidia-smi -L | tee "$out/nvidia-smi.txt"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python -c "import pynvml, pyarrow, numpy, click" || { echo "missing python deps" >&2; exit 1; }
python benchmarks/device/h200_check.py "$out" --seconds "${SECONDS_PER_WORKLOAD:-15}"
