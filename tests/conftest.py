"""Shared fixtures: array backends (NumPy always, CuPy where a GPU answers) and synthetic data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plexgpu import xp as xpmod
from plexgpu.image.synth import SynthDataset, SynthSpec

REPO = Path(__file__).resolve().parents[1]


def _backends():
    params = [pytest.param("numpy", id="numpy"), pytest.param("strict", id="strict")]
    params.append(pytest.param("cupy", id="cupy", marks=pytest.mark.skipif(
        not xpmod.cupy_available(), reason="CuPy with a CUDA device not present (runs on the GPU machine)")))
    return params


@pytest.fixture(params=_backends())
def xp(request):
    """NumPy; the strict CuPy stand-in (tests/strict_device.py: CuPy's refusals on NumPy storage, run
    on every machine); and CuPy itself where a GPU answers."""
    if request.param == "strict":
        from strict_device import STRICT
        return STRICT
    return xpmod.get_xp(request.param)


@pytest.fixture(scope="session")
def small_synth(tmp_path_factory) -> tuple[Path, SynthDataset]:
    """3 cycles x 3x3 tiles x 5 z x 2 channels of 128x128, written once per session."""
    out = tmp_path_factory.mktemp("synth_small")
    ds = SynthDataset(SynthSpec(cycles=3, rows=3, cols=3, tile=(128, 128), z_planes=5, channels=2, seed=3))
    ds.write(out)
    return out, ds


REALDATA = REPO.parent / "shared" / "realdata"


@pytest.fixture(scope="session")
def realdata() -> Path:
    """../shared/realdata (real images with independent references; read its README). Skips with
    the reason where it is absent; with PLEXGPU_REQUIRE_REALDATA=1 (CI) fails instead."""
    if not (REALDATA / "README.md").is_file():
        why = f"real data not found at {REALDATA} (the shared folder beside the repository)"
        if os.environ.get("PLEXGPU_REQUIRE_REALDATA") == "1":
            pytest.fail(f"real-data tests are required here (PLEXGPU_REQUIRE_REALDATA=1) but: {why}")
        pytest.skip(why)
    return REALDATA


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _cluster_up() -> bool:
    import subprocess

    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
        acct = subprocess.run(["sacctmgr", "-n", "-P", "list", "account", "format=account"],
                              capture_output=True, text=True, timeout=10)
        sinfo = subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ("UP" in ping.stdout and {"clive", "maigan"} <= set(acct.stdout.split())
            and "gpu:6" in sinfo.stdout)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The real local SLURM cluster (tests/slurm/start_cluster.sh), started on demand.

    Skips with a reason where it cannot be started; with PLEXGPU_REQUIRE_SLURM=1 (CI) fails instead.
    A cluster this session started is stopped when the session ends (tests/slurm/stop_cluster.sh;
    PLEXGPU_KEEP_SLURM=1 keeps it running); one that was already running is left as it was.
    """
    import shutil
    import subprocess

    required = os.environ.get("PLEXGPU_REQUIRE_SLURM") == "1"
    started_here = False
    if not _cluster_up():
        why = None
        if os.geteuid() != 0:
            why = "starting the test SLURM cluster needs root"
        elif shutil.which("apt-get") is None:
            why = "starting the test SLURM cluster needs Debian's apt-get"
        else:
            res = subprocess.run(["bash", str(REPO / "tests/slurm/start_cluster.sh")], capture_output=True,
                                 text=True, timeout=600)
            if res.returncode != 0 or not _cluster_up():
                why = f"tests/slurm/start_cluster.sh failed: {(res.stderr or res.stdout)[-800:]}"
            started_here = True
        if why:
            if required:
                pytest.fail(f"SLURM tests are required here (PLEXGPU_REQUIRE_SLURM=1) but: {why}")
            pytest.skip(why)
    yield True
    if started_here and os.environ.get("PLEXGPU_KEEP_SLURM") != "1":
        subprocess.run(["bash", str(REPO / "tests/slurm/stop_cluster.sh")], capture_output=True, timeout=300)
