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
    fit = tmp_path / "flux.json"
    fit.write_text(json.dumps({"1": {"iterations": 25, "explained_ratio": 1.07, "flux_ratio": 1.07}}))
    metrics = qc.qc_decon("cyc001", [str(tmp_path / "CH1.ome.tif")], [str(tmp_path / "d/CH1.ome.tif")], str(fit),
                          str(tmp_path / "decon.png"), str(tmp_path / "decon.json"))
    ch = metrics["channels"]["CH1"]
    assert ch["flux_ratio"] == pytest.approx(decon.sum(dtype=np.float64) / stitched.sum(dtype=np.float64), rel=1e-9)

    def grad(a):
        return np.mean(np.abs(np.diff(a, axis=-1))) / np.mean(a)

    assert ch["sharpness_gain"] == pytest.approx(grad(decon[2]) / grad(stitched[2].astype(np.float32)), rel=1e-5)
    assert ch["sharpness_gain"] > 1.1
    assert json.loads((tmp_path / "decon.json").read_text()) == metrics
    assert (tmp_path / "decon.png").stat().st_size > 0
    # RL's fit (the result blurred again against the recorded light) 1.07, beyond 5 %: warn; a third lost fails
    assert metrics["status"] == "warn" and metrics["reasons"] == [
        "CH1: the deconvolved stack blurred again holds 1.070 of the recorded light"]
    fit.write_text(json.dumps({"1": {"iterations": 25, "explained_ratio": 0.66, "flux_ratio": 0.66}}))
    lost = qc.qc_decon("cyc001", [str(tmp_path / "CH1.ome.tif")], [str(tmp_path / "d/CH1.ome.tif")], str(fit),
                       str(tmp_path / "decon.png"), str(tmp_path / "decon.json"))
    assert lost["status"] == "fail" and "holds 0.660 of the recorded light" in lost["reasons"][0]


def test_qc_edf_names_left_out_planes_and_focus_at_the_stack_end(tmp_path):
    """The EDF verdict applies the EDF job's own quality gate to the recorded tile statistics: a plane
    whose tiles were all dropped frames is named; a focus map sitting on the last plane is a warning."""
    nz = 5
    good = {"zero_fraction": 0.0, "saturated_fraction": 0.0, "constant": False}
    recorded = {"1": {str(z): [dict(good, constant=(z == 3)) for _ in range(4)] for z in range(1, nz + 1)}}
    (tmp_path / "planes.json").write_text(json.dumps({"recorded": recorded}))
    edf_img = np.random.default_rng(0).uniform(50, 500, (64, 64)).astype(np.float32)
    write_ome(tmp_path / "CH1.ome.tif", edf_img, "YX")
    focus = np.full((64, 64), nz - 1, np.float32)              # everything in focus on the last plane
    focus[:, :16] = 2.0
    write_ome(tmp_path / "CH1.focus.tif", focus, "YX")
    m = qc.qc_edf("cyc001", [str(tmp_path / "CH1.ome.tif")], [str(tmp_path / "CH1.focus.tif")],
                  str(tmp_path / "planes.json"), str(tmp_path / "edf.png"), str(tmp_path / "edf.json"))
    assert m["status"] == "warn"
    assert m["channels"]["CH1"]["planes_kept"] == nz - 1
    assert any("1 of 5 planes left out" in r for r in m["reasons"])
    assert any("75%" in r and "beyond the z range" in r for r in m["reasons"])


def test_tile_graph_colours_pairs_by_ncc_and_marks_rejected():
    plane = np.zeros((200, 300), np.float32)
    footprints = [[0, 0, 100, 160], [0, 140, 100, 160]]
    pic = qc.tile_graph_picture(plane, footprints, [{"tile_a": "1", "tile_b": "2", "accepted": "1", "ncc": "1.0"}])
    mid = pic[50, 150]
    assert tuple(mid) == qc.ncc_colour(1.0) and mid[1] > mid[0]                 # green: a good seam
    pic = qc.tile_graph_picture(plane, footprints, [{"tile_a": "1", "tile_b": "2", "accepted": "0", "ncc": "0.2"}])
    line = pic[48:53, 95:206]                                                   # between the two tile numbers
    magenta = (line == qc.REJECTED_COLOUR).all(axis=-1).any(axis=0)
    assert 0.3 < magenta.mean() < 0.7                                           # rejected: dashed magenta
    # each tile's number at its centre, white on black
    for cx in (80, 220):
        box = pic[40:61, cx - 12:cx + 13]
        assert (box > 200).all(axis=-1).sum() > 5 and (box == 0).all(axis=-1).sum() > 20   # (anti-aliased)
