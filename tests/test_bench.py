"""The GPU benchmark is ready: its full code path runs on NumPy at a tiny size and prints JSON."""

import json
import subprocess
import sys

from conftest import REPO


def test_gpu_cycle_tiny_on_numpy():
    res = subprocess.run([sys.executable, str(REPO / "bench/gpu_cycle.py"), "--tiny", "--backend", "numpy",
                          "--iterations", "3"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["backend"] == "numpy" and out["total_s"] > 0
    assert {"stitch_s", "deconvolve_s", "edf_s"} <= set(out)
