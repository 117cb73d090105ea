"""Defective sensor pixels found from their persistence across the tiles and repaired before BaSiC
and stitching (image/defects.py, stages.stitch)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from plexgpu import paths, stages
from plexgpu import xp as xpmod
from plexgpu.config import validate_config
from plexgpu.experiment import cycle_spec, resolve_experiment
from plexgpu.image import defects
from plexgpu.image.synth import SynthDataset, SynthSpec, load_truth
from plexgpu.io.raw import tile_filename
from plexgpu.io.tiff import read_tiff
from plexgpu.job import job_context
from plexgpu.planes import PlanesRecord

REGIME = dict(cycles=1, rows=5, cols=7, tile=(128, 160), z_planes=3, channels=1, overlap=0.3, seed=0)


def _tiles(raw, ds, z=2, ch=1):
    n = ds.spec.rows * ds.spec.cols
    return [read_tiff(raw / "cyc001_reg001" / tile_filename(1, t, z, ch)) for t in range(1, n + 1)]


def test_hot_and_stuck_pixels_found_exactly_and_none_on_a_clean_camera(tmp_path, xp):
    ds = SynthDataset(SynthSpec(**REGIME, hot_pixels=0.002))
    raw = ds.write(tmp_path / "raw")
    tiles = _tiles(raw, ds)
    hy, hx, _ = ds.hot_pixels()
    tiles = [t.copy() for t in tiles]
    stuck = int(np.median([t[7, 9] for t in tiles]))          # one stuck pixel: the same, ordinary reading in
    for t in tiles:                                           # every tile (no spike: only its constancy shows)
        t[7, 9] = stuck
    found = defects.find_defects([xpmod.to_device(t, xp) for t in tiles], xp)
    got = {(int(y), int(x)): k for y, x, k in zip(found.y, found.x, found.kind)}
    assert {p for p, k in got.items() if k == "hot"} == set(zip(hy.tolist(), hx.tolist()))
    assert got.get((7, 9)) == "stuck" and len(got) == len(hy) + 1
    clean = SynthDataset(SynthSpec(**REGIME)).write(tmp_path / "clean")
    assert len(defects.find_defects([xpmod.to_device(t, xp) for t in _tiles(clean, ds)], xp)) == 0


def test_repair_takes_the_neighbours_median(xp):
    tile = np.full((8, 8), 100, np.uint16)
    tile[3, 4] = 4000
    tile[2, 3] = 104
    d = defects.Defects(np.array([3]), np.array([4]), ["hot"], np.array([3900.0]), (8, 8))
    out = xpmod.to_host(defects.repair(xpmod.to_device(tile, xp), d))
    assert out[3, 4] == 100 and out.dtype == np.uint16 and tile[3, 4] == 4000     # a copy, the input kept


def test_a_dark_frame_names_its_hot_pixels():
    rng = np.random.default_rng(0)
    frame = rng.normal(100, 2, (64, 80)).astype(np.float32)
    frame[10, 20] += 900
    d = defects.defects_in_dark_frame(frame)
    assert list(zip(d.y.tolist(), d.x.tolist())) == [(10, 20)] and d.kind == ["dark frame"]


def _run_stitch(tmp_path, ds, basic_cfg: dict | None = None):
    """The stitch stage on a written synthetic data set, its outputs where the registry puts them."""
    raw = ds.write(tmp_path / "raw")
    config = validate_config({"raw_dir": str(raw), "results_dir": str(tmp_path / "res"), "compute": {"device": "cpu"},
                              "basic": basic_cfg or {}})
    cs = cycle_spec(resolve_experiment(config), 1)
    out = paths.outputs("stitch", tmp_path / "res", list(cs.channels), cs.key)
    (tmp_path / "res" / "stitched" / cs.key).mkdir(parents=True)
    (tmp_path / "res" / "basic" / cs.key).mkdir(parents=True)
    with job_context("stitch", str(tmp_path / "stitch.log"), {"cpus_per_task": 2}, "cpu") as ctx:
        result = stages.stitch(ctx, cs, config["basic"], config["stitch"], out)
    return raw, cs, out, result


def _stitch(tmp_path, **spec):
    raw, cs, out, result = _run_stitch(tmp_path, SynthDataset(SynthSpec(**{**REGIME, **spec})))
    with open(out["positions"]) as fh:
        pos = np.array([[float(r["y_px"]), float(r["x_px"])] for r in csv.DictReader(fh)])
    err = pos - np.array(json.loads((raw / "truth" / "truth.json").read_text())["positions"][0])
    err -= np.median(err, axis=0)
    truth_ds, _ = load_truth(raw)
    flat = read_tiff(out["profiles"][0])[:, 0]
    true_flat = np.stack([truth_ds.flatfield(1, z) for z in range(1, cs.z_planes + 1)])
    flat_err = float(np.abs(flat / flat.mean(axis=(1, 2), keepdims=True) - true_flat).mean())
    return result, float(np.abs(err).max()), flat_err, out


@pytest.mark.slow
def test_hot_pixels_stitch_as_the_same_regime_without_them(tmp_path):
    """0.05 % hot pixels at 300-4000 counts, the same sensor positions in every tile: before they were
    found, 52 of 58 pairs were accepted and a tile was 2.6 px off; now as without them."""
    clean, clean_err, clean_flat, _ = _stitch(tmp_path / "clean")
    hot, hot_err, hot_flat, out = _stitch(tmp_path / "hot", hot_pixels=0.0005)
    assert hot["pairs_accepted"] == clean["pairs_accepted"] and hot_err <= 0.5, (hot, hot_err)
    assert abs(hot_err - clean_err) < 0.05 and abs(hot_flat - clean_flat) < 0.005, (hot_err, clean_err, hot_flat)
    with open(out["defects"]) as fh:
        listed = {(int(r["y"]), int(r["x"])) for r in csv.DictReader(fh)}
    hy, hx, _ = SynthDataset(SynthSpec(**REGIME, hot_pixels=0.0005)).hot_pixels()
    assert listed == set(zip(hy.tolist(), hx.tolist()))
    assert PlanesRecord.read(out["planes"]).defective_pixels["hot"] == len(listed) == hot["defective_pixels"]
    assert clean["defective_pixels"] == 0


@pytest.mark.slow
def test_one_camera_offset_per_channel_for_all_its_planes(tmp_path):
    """A dense stain, no bare slide, offset 110 counts with a ramp: each plane's low envelope alone put the
    offset anywhere from 0 to 469 counts; the channel gets one offset, the same on every plane, from its
    tile overlaps (each plane's answer kept as a diagnostic: 103-117 and 132-136 counts), within 10 counts
    of the truth (111 for 118, 133 for 129) and certain, so the QC page has no offset warning for it. (Where the data
    cannot pin it down, the warning that names basic.darkfield: test_qc_verdicts.)"""
    from plexgpu import qc

    ds = SynthDataset(SynthSpec(cycles=1, rows=5, cols=6, tile=(128, 160), overlap=0.2, z_planes=5, channels=2,
                                jitter_px=2.0, vignetting=0.45, nuclei_density=3.0, tissue_fraction=1.0,
                                dark_offset=110.0, seed=1))
    _, cs, out, _ = _run_stitch(tmp_path, ds)
    record = PlanesRecord.read(out["planes"])
    for ch in cs.channels:
        per_plane = {record.shading[f"{ch}/{z}"]["offset_mean"] for z in range(1, cs.z_planes + 1)}
        assert len(per_plane) == 1, per_plane                          # no plane gets an offset of its own
        o = record.offsets[str(ch)]
        truth = float(ds.darkfield(ch, 1).mean())
        assert abs(o["counts"] - truth) <= 10 and not o["uncertain"], (ch, o, truth)
        assert o["counts"] == pytest.approx(per_plane.pop(), abs=1e-3)
        assert o["model"] == "overlaps" and len(o["per_plane"]) == cs.z_planes, o
    m = qc.qc_stitch(cs.key, out["profiles"], out["pairs"], out["planes"], out["stitched"][0],
                     str(tmp_path / "qc.png"), str(tmp_path / "qc.shading.png"), str(tmp_path / "qc.json"))
    assert not [r for r in m["reasons"] if "camera offset uncertain" in r], m["reasons"]


def _column_tiles(rng, pattern, light: float, n: int = 20, shape=(96, 128)):
    """Tiles of one sensor: a 450-count offset with a ramp and ``pattern`` per column, a specimen of
    ``light`` counts in random blobs (somewhere else in every tile), Poisson + read noise."""
    h, w = shape
    yy, xx = np.mgrid[0:h, 0:w]
    tiles = []
    for _ in range(n):
        specimen = np.zeros(shape)
        for cy, cx in rng.uniform(0, 1, (12, 2)) * shape:
            specimen += light * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 50.0)
        signal = rng.poisson(specimen) + rng.normal(0, 3, shape)
        tiles.append(np.rint(450 + 0.3 * xx + 0.1 * yy + pattern[None, :] + signal).astype(np.uint16))
    return tiles


def test_column_offsets_of_the_sensor_found_under_the_specimen(xp):
    """A +-2 % column pattern under a 450-count offset is found from the tiles' low envelope (the
    specimen elsewhere in every tile); a sensor without one gets (nearly) nothing subtracted."""
    rng = np.random.default_rng(3)
    pattern = rng.uniform(-9, 9, 128)
    found = defects.column_offsets([xpmod.to_device(t, xp) for t in _column_tiles(rng, pattern, 800.0)], xp)
    truth = pattern - pattern.mean()
    assert np.std(found - truth) < 0.25 * np.std(truth), (np.std(found - truth), np.std(truth))
    none = defects.column_offsets(_column_tiles(rng, np.zeros(128), 800.0))
    assert np.std(none) < 0.5, np.std(none)
    assert not defects.column_offsets(_column_tiles(rng, pattern, 800.0, n=4)).any()  # too few tiles


@pytest.mark.slow
def test_column_offsets_part_of_the_camera_offset(tmp_path):
    """Offset 450 counts with a ramp and a +-2 % column pattern (5.5 counts rms): the darkfield written
    holds the pattern, so what is left of it in every tile is below 2.5 counts rms (was all of it); the
    offset within 11 counts as before (7.9 / 10.2 low then, 7.6 / 10.8 now: the pattern's slow part,
    which cannot be told from the light under the flatfield, still pulls it)."""
    ds = SynthDataset(SynthSpec(cycles=1, rows=4, cols=5, tile=(128, 160), overlap=0.2, z_planes=5, channels=2,
                                jitter_px=2.0, vignetting=0.45, dark_offset=450.0, seed=5))
    _, cs, out, _ = _run_stitch(tmp_path, ds)
    record = PlanesRecord.read(out["planes"])
    for ch, path in zip(cs.channels, out["profiles"]):
        truth = ds.darkfield(ch, 1)
        assert abs(record.offsets[str(ch)]["counts"] - float(truth.mean())) < 11, (ch, record.offsets, truth.mean())
        left = read_tiff(path)[0, 1] - truth
        assert np.std(left.mean(axis=0) - left.mean()) < 2.5, (ch, np.std(left.mean(axis=0)))
        assert record.offsets[str(ch)]["column_offsets_rms"] > 4
