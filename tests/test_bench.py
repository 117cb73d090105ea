"""The GPU benchmark is ready: its full code path (the workflow's own stage functions) runs on NumPy
at a tiny size and prints JSON."""

import json
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow
def test_gpu_cycle_tiny_on_numpy():
    res = subprocess.run([sys.executable, str(REPO / "bench/gpu_cycle.py"), "--tiny", "--backend", "numpy",
                          "--iterations", "3"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["backend"] == "numpy" and out["total_s"] > 0
    from plexgpu.paths import cycle_stages

    assert {f"{s}_s" for s in cycle_stages()} <= set(out)          # every per-cycle stage of the registry, timed
    # the stacks went through the stages' own writers: tiled, compressed files on disk
    assert 0 < out["stack_fraction_of_pixels"]["stitched"] < 1 and 0 < out["stack_fraction_of_pixels"]["deconvolved"] < 1
