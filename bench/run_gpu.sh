#!/usr/bin/env bash
# One command for a lent GPU machine (H200). Nothing can be fetched there, so nothing is
# installed: the image's python3 already has numpy, scipy, tifffile, CuPy and pytest, which is
# all the algorithms need (Snakemake is not needed for these checks). At most ~9 minutes:
#   1. the GPU guard every GPU job runs;
#   2. every algorithm test on CuPy (BaSiC, stitching, RL, EDF, registration, streamed I/O);
#   3. one full-size synthetic cycle through stitch -> deconvolve -> edf on CuPy, JSON out (measured peak
#      GPU memory per stage beside what plexgpu.gpu_memory predicts: peak_gpu_mem_gib, predicted_peak_gib).
# Outputs go to $OUT (the device tool's folder) or bench/results.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/workflow${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DEST=${OUT:-bench/results}
mkdir -p "$DEST"
$PY -c "from plexgpu.cluster.gpu import require_gpu; print('GPU:', require_gpu())" || exit 1
timeout 150 $PY -m pytest -q -p no:cacheprovider -k cupy tests/test_basic.py tests/test_stitching.py \
    tests/test_deconvolution.py tests/test_edf_registration.py 2>&1 | tee "$DEST/gpu_tests.log"
timeout 390 $PY bench/gpu_cycle.py --backend cupy | tee "$DEST/gpu_cycle.json"
