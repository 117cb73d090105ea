"""Shared fixtures: array backends (NumPy always, CuPy where a GPU answers) and synthetic data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plexgpu import xp as xpmod
from plexgpu.synth import SynthDataset, SynthSpec

REPO = Path(__file__).resolve().parents[1]


def _backends():
    params = [pytest.param("numpy", id="numpy")]
    params.append(pytest.param("cupy", id="cupy", marks=pytest.mark.skipif(
        not xpmod.cupy_available(), reason="CuPy with a CUDA device not present (runs on the GPU machine)")))
    return params


@pytest.fixture(params=_backends())
def xp(request):
    return xpmod.get_xp(request.param)


@pytest.fixture(scope="session")
def small_synth(tmp_path_factory) -> tuple[Path, SynthDataset]:
    """3 cycles x 3x3 tiles x 5 z x 2 channels of 128x128, written once per session."""
    out = tmp_path_factory.mktemp("synth_small")
    ds = SynthDataset(SynthSpec(cycles=3, rows=3, cols=3, tile=(128, 128), z_planes=5, channels=2, seed=3))
    ds.write(out)
    return out, ds


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
