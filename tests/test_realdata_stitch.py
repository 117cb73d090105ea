"""The stitch stage on real widefield tiles it was never tuned to: ../shared/realdata/wsi_brain
(63 tiles of 512^2, 9 x 7, 10 % overlap, a snake from the top-right, strong vignetting, bare
slide, a camera turned ~1 deg), against Fiji's registered positions and BaSiCPy's stored
flatfield. Runs the workflow's own stage function on the tiles laid out as raw data."""

from __future__ import annotations

import csv
import json
import sys

import numpy as np
import pytest

from plexgpu.image import basic, overlap_fit, stitching

from conftest import REPO
from plexgpu import stages
from plexgpu.experiment import CycleSpec
from plexgpu.io.raw import tile_filename
from plexgpu.io.tiff import read_tiff
from plexgpu.job import job_context
from plexgpu.image.phasecorr import ncc

pytestmark = pytest.mark.slow                     # a real-data run: the full tier (make test) only
sys.path.insert(0, str(REPO / "bench"))
from common import overlap_log_ratios, wsi_brain_fiji  # noqa: E402  (bench's: the same measure, one copy)
ROWS, COLS, ORDER = 7, 9, "snake-rows-top-right"


@pytest.fixture(scope="module")
def wsi(realdata, tmp_path_factory):
    src = realdata / "wsi_brain"
    tmp = tmp_path_factory.mktemp("wsi")
    folder = tmp / "cyc001_reg001"
    folder.mkdir()
    for t in range(1, ROWS * COLS + 1):               # the raw layout, pointing at the read-only originals
        (folder / tile_filename(1, t, 1, 1)).symlink_to(src / "tiles" / f"C3-BrainSection{t:04d}.tif")
    spec = CycleSpec(cycle=1, key="cyc001", folder=str(folder), region=1, rows=ROWS, cols=COLS, order=ORDER,
                     overlap=0.1, z_planes=1, channels=(1,), markers=("brain",), pixel_size_um=2.58,
                     z_step_um=1.0, emission_nm=(520.0,))
    res = tmp / "results"
    res.mkdir()
    out = {"stitched": [str(res / "CH1.ome.tif")], "profiles": [str(res / "CH1.profiles.tif")],
           "positions": str(res / "positions.csv"), "pairs": str(res / "pairs.csv"), "planes": str(res / "planes.json"),
           "defects": str(res / "defects.csv")}
    from plexgpu.config import validate_config

    cfg = validate_config({"raw_dir": str(tmp)})
    with job_context("stitch", str(tmp / "stitch.log"), {"cpus_per_task": 2}, "cpu") as ctx:
        stages.stitch(ctx, spec, cfg["basic"], cfg["stitch"], out)
    tiles = np.stack([read_tiff(src / "tiles" / f"C3-BrainSection{t:04d}.tif") for t in range(1, 64)])
    with open(out["positions"]) as fh:
        pos = np.array([[float(r["y_px"]), float(r["x_px"])] for r in csv.DictReader(fh)])
    with open(out["pairs"]) as fh:
        pairs = [r for r in csv.DictReader(fh) if r["tile_a"].isdigit()]
    return {"tiles": tiles, "pos": pos, "pairs": pairs, "profiles": read_tiff(out["profiles"][0]),
            "fiji": {t: np.array(p) for t, p in wsi_brain_fiji().items()},
            "planes": json.loads((res / "planes.json").read_text()),
            "ref": np.load(src / "basicpy_reference_results.npz", allow_pickle=True)["wsi_brain"].item()}


def _overlap(off):
    """The overlap of tile b at ``off`` (y, x) from tile a, rounded to whole pixels: (slices in a, slices in b)."""
    iy, ix = np.rint(off).astype(int)
    return ((slice(max(iy, 0), 512 + min(iy, 0)), slice(max(ix, 0), 512 + min(ix, 0))),
            (slice(max(-iy, 0), 512 + min(-iy, 0)), slice(max(-ix, 0), 512 + min(-ix, 0))))


def _reference_pairs(wsi):
    """Pairs Fiji placed right: both tiles in Fiji's list (tile 45 out: Fiji is ~52 px off there),
    NCC > 0.7 at Fiji's offset, and Fiji's offset on Fiji's own grid (within 3 px of its median
    step in that direction: off-grid offsets are Fiji's misplaced bare-slide tiles)."""
    fiji, tiles = wsi["fiji"], wsi["tiles"].astype(np.float32)
    step = stitching.nominal_step((512, 512), 0.1)
    rows = []
    for p in wsi["pairs"]:
        a, b, d = int(p["tile_a"]), int(p["tile_b"]), p["direction"]
        if a in fiji and b in fiji and 45 not in (a, b):
            off = fiji[b] - fiji[a]
            rows.append((p, d, off, off - (np.array([0, step[1]]) if d == "h" else np.array([step[0], 0]))))
    median = {d: np.median([dev for _, dd, _, dev in rows if dd == d], axis=0) for d in "hv"}
    out = []
    for p, d, off, dev in rows:
        a, b = int(p["tile_a"]) - 1, int(p["tile_b"]) - 1
        sa, sb = _overlap(off)
        if np.abs(dev - median[d]).max() <= 3 and ncc(tiles[a][sa], tiles[b][sb]) > 0.7:
            out.append((p, off, dev))
    return out


def test_pairs_accepted_where_the_reference_is_clear(wsi):
    ref = _reference_pairs(wsi)
    accepted = [(p, off, dev) for p, off, dev in ref if p["accepted"] == "1"]
    measured = [np.abs(np.array([float(p["dy_px"]), float(p["dx_px"])]) - dev).max() for p, _, dev in accepted]
    solved = [np.abs(wsi["pos"][int(p["tile_b"]) - 1] - wsi["pos"][int(p["tile_a"]) - 1] - off).max()
              for p, off, _ in accepted]
    print(f"{len(accepted)} of {len(ref)} clear reference pairs accepted; measured offsets vs Fiji: median "
          f"{np.median(measured):.2f}, max {max(measured):.2f} px; solved: max {max(solved):.2f} px")
    assert len(ref) >= 50
    assert len(accepted) >= 0.9 * len(ref)                # was 43 of 78 (55 %)
    assert max(measured) <= 1.0 and max(solved) <= 1.0
    assert np.median(measured) <= 0.3


def test_no_pair_far_from_the_stage_model(wsi):
    """Bare-slide pairs are accepted only where their peak lies within the stage model's window of
    a few px (never a 43 px misplacement); the camera rotation (~7.7 px across each step) is the
    model, not a rejection."""
    step = stitching.nominal_step((512, 512), 0.1)
    accepted = [p for p in wsi["pairs"] if p["accepted"] == "1"]
    for d in "hv":
        dev = np.array([(float(p["dy_px"]), float(p["dx_px"])) for p in accepted if p["direction"] == d])
        spread = np.abs(dev - np.median(dev, axis=0)).max()
        print(f"{d}: median deviation {np.median(dev, axis=0).round(2)}, farthest accepted pair {spread:.2f} px")
        assert spread <= 2.5
    rot = np.degrees(np.arctan2(np.median([float(p["dy_px"]) for p in accepted if p["direction"] == "h"]), step[1]))
    assert 0.8 < rot < 1.2


def test_positions_match_fiji(wsi):
    """Fiji's positions to within the lens distortion, and seams at least as good as Fiji's.

    The camera's distortion leaves no one translation right for a pair: measured on these tiles, the
    along-step offset of the overlap's end thirds is 0.36-0.66 px larger than its middle third's
    (median over the pairs). Phase correlation (Fiji's, and ours before the overlap fit) weighs the
    middle of the strip; the exact-overlap fit weighs all of it, 0.16 px apart along the step. What the
    user sees is the seam: the corrected overlap's NCC at our offsets against Fiji's."""
    fiji, pos = wsi["fiji"], wsi["pos"]
    ids = [t for t in sorted(fiji) if t != 45]
    d = np.array([pos[t - 1] for t in ids]) - np.array([fiji[t] for t in ids])
    err = np.abs(d - np.median(d, axis=0)).max(axis=1)
    prof = wsi["profiles"].reshape(-1, 2, 512, 512)
    tiles = (wsi["tiles"].astype(np.float32) - prof[0, 1]) / prof[0, 0]
    ours, theirs = [], []
    for p, off, _dev in _reference_pairs(wsi):
        a, b = int(p["tile_a"]) - 1, int(p["tile_b"]) - 1
        ours.append(overlap_fit.exact_ncc(tiles[a], tiles[b], pos[b] - pos[a]))
        theirs.append(overlap_fit.exact_ncc(tiles[a], tiles[b], off))
    ours, theirs = np.array(ours), np.array(theirs)
    print(f"positions vs Fiji ({len(ids)} tiles): median {np.median(err):.2f} px; seams (NCC of the corrected "
          f"overlap, {len(ours)} pairs): ours median {np.median(ours):.4f}, Fiji's {np.median(theirs):.4f}, ours "
          f"higher on {(ours > theirs).sum()}")
    assert np.median(err) <= 0.5
    assert np.median(ours - theirs) >= 0 and (ours >= theirs - 0.002).mean() >= 0.9


def test_shading_against_basicpy_and_no_clipping(wsi):
    prof, tiles = wsi["profiles"].reshape(-1, 2, 512, 512), wsi["tiles"].astype(np.float32)
    flat, dark = prof[0, 0], prof[0, 1]
    ref = wsi["ref"]["flatfield"] / wsi["ref"]["flatfield"].mean()
    ours = basic.downsample(flat[None], 128)[0]
    rms = float(np.sqrt(np.mean((ours / ours.mean() - ref) ** 2)))
    below = float(((tiles - dark) < 0).mean())
    p1 = float(np.percentile(tiles, 1))
    print(f"flatfield vs BaSiCPy's reference {rms:.2%}; offset {wsi['planes']['offsets']['1']['counts']:.0f}, darkfield "
          f"mean {dark.mean():.0f} (raw 1st percentile {p1:.0f}); "
          f"{below:.3%} of corrected pixels below 0")
    assert rms <= 0.03
    assert wsi["planes"]["offsets"]["1"]["counts"] <= p1   # was 1037 (the bare-slide background)
    assert below < 0.005                                   # was 6.3 %
    shading = wsi["planes"]["shading"]["1/1"]
    assert shading["refined"] and shading["seam_after"] < shading["seam_before"]


def test_the_overlaps_read_the_same_once_corrected(wsi):
    """The two corrected readings of the same specimen where tiles overlap (Fiji's clear pairs, smoothed by 3 px:
    its positions are whole pixels) agree: a wrong additive term or flatfield shows as a ratio other than 1.
    These tiles carry stray light fixed to the sensor in two corners (up to ~550 counts, not shaded by the
    flatfield); the overlaps chose the envelope as the additive term to fit the flatfield with. With the camera
    offset alone subtracted from the output the readings were 7.4 % apart (median |log ratio|), with the additive
    term the flatfield was fitted with 2.8 % (basicpy 2.0.0's flat- and darkfield from all tiles: 4.0 %); on
    2026-12-07 5.6 % and 2.6 %. The measure is the bench's (``bench/common.overlap_log_ratios``)."""
    prof = wsi["profiles"].reshape(-1, 2, 512, 512)
    flat, dark = prof[0, 0] / prof[0, 0].mean(), prof[0, 1]
    tiles = wsi["tiles"].astype(np.float32)
    offset = wsi["planes"]["offsets"]["1"]["counts"]

    pairs = [(int(p["tile_a"]) - 1, int(p["tile_b"]) - 1, *np.rint(off).astype(int)) for p, off, _ in _reference_pairs(wsi)]

    def apart(additive):
        return float(np.median(overlap_log_ratios(tiles, pairs, flat, additive)))
    ours, offset_alone = apart(dark), apart(np.full_like(dark, offset))
    light = wsi["planes"]["shading"]["1/1"]["added_light"]
    print(f"overlaps' corrected readings apart: {ours:.2%} (the envelope's excess {light:.0f} counts on average), "
          f"with the offset alone {offset_alone:.2%}")
    assert ours <= 0.035 and ours < 0.5 * offset_alone
