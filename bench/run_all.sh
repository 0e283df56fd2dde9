#!/usr/bin/env bash
# Runs every benchmark against the build in $1 (default: build) and writes bench/results/.
set -euo pipefail
build="${1:-build}"
venv="$(bash scripts/install.sh | sed -n 's/^TESSERA_VENV=//p')"
"$venv/bin/python" bench/compare_pytorch.py "$build"
bash bench/pipeline_bubble.sh "$build" 50
python3 bench/pipeline_memory.py "$build"
python3 bench/pipeline_throughput.py "$build"
python3 bench/pipeline_zero3.py "$build"
python3 bench/pipeline_profile_cut.py "$build"
python3 bench/swap.py "$build" all
