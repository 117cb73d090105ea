"""QC metrics computed from files, against the same numbers computed directly."""

import json

import numpy as np
import pytest

from plexgpu import qc
from plexgpu.io.tiff import write_ome


def test_qc_decon_flux_and_sharpness_from_streamed_planes(tmp_path):
    rng = np.random.default_rng(3)
    stitched = rng.integers(100, 4000, (5, 80, 90)).astype(np.uint16)
    decon = (stitched.astype(np.float32) * 1.02)
    decon[2, :, ::2] *= 1.5                     # a sharper middle plane
    write_ome(tmp_path / "CH1.ome.tif", stitched, "ZYX")
    (tmp_path / "d").mkdir()
    write_ome(tmp_path / "d/CH1.ome.tif", decon, "ZYX")
    metrics = qc.qc_decon("cyc001", [str(tmp_path / "CH1.ome.tif")], [str(tmp_path / "d/CH1.ome.tif")],
                          str(tmp_path / "decon.png"), str(tmp_path / "decon.json"))
    ch = metrics["channels"]["CH1"]
    assert ch["flux_ratio"] == pytest.approx(decon.sum(dtype=np.float64) / stitched.sum(dtype=np.float64), rel=1e-9)

    def grad(a):
        return np.mean(np.abs(np.diff(a, axis=-1))) / np.mean(a)

    assert ch["sharpness_gain"] == pytest.approx(grad(decon[2]) / grad(stitched[2].astype(np.float32)), rel=1e-5)
    assert ch["sharpness_gain"] > 1.1
    assert json.loads((tmp_path / "decon.json").read_text()) == metrics
    assert (tmp_path / "decon.png").stat().st_size > 0
