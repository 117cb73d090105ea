#!/usr/bin/env bash
# One command for a GPU machine (H200): install the GPU extra, check the GPU, time one full cycle.
# Prints JSON; stays within ~8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-gpu 2>/dev/null || true
.venv-gpu/bin/pip install -q -e ".[gpu]"
.venv-gpu/bin/plexgpu verify-gpu
timeout 480 .venv-gpu/bin/python bench/gpu_cycle.py --backend cupy
