"""The schedule simulator reproduces the reference GPU-only vs CPU-fallback table
(9 cycles, 5 GPU slots, GPU 8 + 12 + 1.5 min, CPU 200 + 60 + 22 min)."""

import subprocess
import sys

import pytest

from plexgpu.cluster.simulate import simulate

ACCOUNTS = [{"name": "clive", "gpu_slots": 3}, {"name": "maigan", "gpu_slots": 2}]


def test_gpu_only_about_44_minutes():
    res = simulate(9, ACCOUNTS, (8, 12, 1.5), "gpu-only", registration_min=1.0)
    assert res.makespan_min == pytest.approx(44, abs=1.5)
    assert res.waves == 2
    assert res.busy_min["clive"] == pytest.approx(6 * 21.5) and res.busy_min["maigan"] == pytest.approx(3 * 21.5)
    # no account ever holds more GPUs than its slots
    for pool, slots in (("clive", 3), ("maigan", 2)):
        events = sorted([(s, 1) for p, _, _, s, e in res.jobs if p == pool] +
                        [(e, -1) for p, _, _, s, e in res.jobs if p == pool])
        n = peak = 0
        for _, d in events:
            n += d
            peak = max(peak, n)
        assert peak <= slots


def test_cpu_fallback_about_18_hours_and_more_cpu_slots_do_not_close_the_gap():
    one = simulate(9, ACCOUNTS, (8, 12, 1.5), "cpu-fallback", (200, 60, 22), cpu_slots=1)
    four = simulate(9, ACCOUNTS, (8, 12, 1.5), "cpu-fallback", (200, 60, 22), cpu_slots=4)
    gpu = simulate(9, ACCOUNTS, (8, 12, 1.5), "gpu-only")
    assert one.makespan_min / 60 == pytest.approx(18.8, abs=0.5)
    assert four.makespan_min / 60 == pytest.approx(4.7, abs=0.2)
    assert four.makespan_min > 6 * gpu.makespan_min


def test_cli_simulate():
    res = subprocess.run([sys.executable, "-m", "plexgpu.cli", "plan", "--configfile", "config/config.yaml",
                          "--simulate", "--cycles", "9"], capture_output=True, text=True,
                         cwd=__import__("conftest").REPO)
    assert res.returncode == 0, res.stderr
    assert "gpu-only: makespan 43.0 min" in res.stdout and "cpu-fallback: makespan 1128.0 min (18.8 h)" in res.stdout
