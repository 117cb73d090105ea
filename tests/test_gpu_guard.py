"""The GPU guard on a machine without a usable GPU: CuPy imports (the test extra installs it), the
first CUDA call fails, and a GPU job stops in one line before any work -- never on the CPU."""

from __future__ import annotations

import json

import pytest

from plexgpu import xp as xpmod
from plexgpu.cluster.gpu import GPUUnavailable, require_gpu
from plexgpu.job import job_context

pytestmark = pytest.mark.skipif(xpmod.cupy_available(), reason="a usable GPU is present: the guard passes here")


def test_no_device_is_one_line_naming_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(GPUUnavailable) as err:
        require_gpu()
    msg = str(err.value)
    assert msg.startswith("no usable GPU: ") and "\n" not in msg
    assert "CUDA_VISIBLE_DEVICES='0'" in msg or "CuPy is not importable" in msg


def test_a_job_given_no_gpu_is_told_so(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(GPUUnavailable, match="set but empty"):
        require_gpu()


def test_gpu_job_fails_before_its_stage_and_records_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    ran = []
    with pytest.raises(SystemExit) as err:
        with job_context("stitch", str(tmp_path / "stitch.log"), {"cpus_per_task": 2}, "gpu",
                         str(tmp_path / "acct"), "cyc001"):
            ran.append("stage")
    assert ran == [] and str(err.value).startswith("stitch: no usable GPU: ")
    records = list((tmp_path / "acct").rglob("*.json"))
    assert len(records) == 1
    rec = json.loads(records[0].read_text())
    assert rec["status"] == "failed" and "no usable GPU" in rec["error"], rec
