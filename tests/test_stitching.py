"""Grid stitching against synthetic truth: positions right to half a pixel."""

import numpy as np
import pytest

from plexgpu import stitching
from plexgpu import xp as xpmod
from plexgpu.io.raw import grid_layout
from plexgpu.phasecorr import phase_correlation
from plexgpu.synth import SynthDataset, SynthSpec


def _corrected_tiles(ds, xp, ch=1, z=2, seed=0):
    rng = np.random.default_rng(seed)
    flat, dark = ds.flatfield(ch, z), ds.darkfield(ch, z)
    tiles = []
    for t in ds.expected_tiles(1, ch, z):
        raw = rng.poisson(np.clip(t - dark, 0, None)) + dark + rng.normal(0, 3, t.shape)
        tiles.append(xpmod.to_device(((raw - dark) / flat).astype(np.float32), xp))
    return tiles


def _errors(model, ds):
    truth = np.array(ds.positions[0], float)
    err = model.positions - truth
    return np.abs(err - np.median(err, axis=0))


@pytest.mark.parametrize("order", ["snake", "rows"])
def test_positions_within_half_pixel(xp, order):
    ds = SynthDataset(SynthSpec(cycles=1, rows=4, cols=5, tile=(128, 160), z_planes=3, channels=1,
                                order=order, seed=4))
    model = stitching.compute_model(_corrected_tiles(ds, xp), grid_layout(4, 5, order), ds.spec.overlap)
    err = _errors(model, ds)
    print(f"{order}: max position error {err.max():.3f} px")
    assert err.max() <= 0.5
    assert sum(p.accepted for p in model.pairs) >= 0.8 * len(model.pairs)  # bare slide may blank a few


def test_blank_tiles_rejected_and_placed_by_stage_model(xp):
    spec = SynthSpec(cycles=1, rows=3, cols=4, tile=(128, 128), z_planes=3, channels=1, seed=2,
                     blank_tiles=(5, 6))
    ds = SynthDataset(spec)
    model = stitching.compute_model(_corrected_tiles(ds, xp), grid_layout(3, 4, "snake"), spec.overlap)
    rejected = {(p.a + 1, p.b + 1) for p in model.pairs if not p.accepted}
    assert rejected and all(5 in pr or 6 in pr for pr in rejected)
    assert all("not significant" in p.reason for p in model.pairs if not p.accepted)
    err = _errors(model, ds)
    content = [t for t in range(12) if t + 1 not in (5, 6)]
    print(f"max error: tiles with content {err[content].max():.3f} px, blank tiles {err[[4, 5]].max():.2f} px")
    assert err[content].max() <= 0.5
    assert err[[4, 5]].max() <= 2 * spec.jitter_px + 1  # a blank tile can only be where the stage put it


def test_repetitive_texture_is_ambiguous(xp):
    yy, xx = np.mgrid[0:400, 0:400]
    pattern = (np.sin(2 * np.pi * xx / 8) * np.sin(2 * np.pi * yy / 8)).astype(np.float32)
    rng = np.random.default_rng(0)
    a = pattern[:128, 100:140] + rng.normal(0, 0.05, (128, 40))
    b = pattern[:128, 104:144] + rng.normal(0, 0.05, (128, 40))
    m = phase_correlation(xpmod.to_device(a, xp), xpmod.to_device(b, xp))
    assert m.ambiguity > stitching.MAX_AMBIGUITY


def test_pure_noise_overlap_not_significant(xp):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(128, 40)), rng.normal(size=(128, 40))
    m = phase_correlation(xpmod.to_device(a, xp), xpmod.to_device(b, xp))
    assert m.significance < m.noise_threshold


def test_blend_reproduces_specimen(xp):
    spec = SynthSpec(cycles=1, rows=2, cols=3, tile=(96, 96), z_planes=3, channels=1, seed=6,
                     poisson=False, read_noise=0.0)
    ds = SynthDataset(spec)
    flat, dark = ds.flatfield(1, 2), ds.darkfield(1, 2)
    tiles = [xpmod.to_device((t - dark) / flat, xp) for t in ds.expected_tiles(1, 1, 2)]
    truth = np.array(ds.positions[0], float)
    model = stitching.StitchModel(layout=grid_layout(2, 3, "snake"), tile_shape=(96, 96),
                                  positions=truth - truth.min(0))
    mosaic = xpmod.to_host(stitching.blend(tiles, model))
    y0, x0 = truth.min(0).astype(int)
    plane = ds.amplitude(1) * ds.stack(1, 1)[1]
    expect = plane[y0:y0 + mosaic.shape[0], x0:x0 + mosaic.shape[1]]
    covered = np.zeros(mosaic.shape, bool)
    for y, x in model.placement:
        covered[y:y + 96, x:x + 96] = True
    assert np.abs(mosaic - expect)[covered].max() < 1e-3 * plane.max()
    assert (mosaic[~covered] == 0).all()


def test_positions_csv_roundtrip():
    model = stitching.StitchModel(layout=[(0, 0), (0, 1)], tile_shape=(10, 10),
                                  positions=np.array([[0.0, 0.0], [0.25, 7.5]]))
    back = stitching.StitchModel.from_positions_csv(model.positions_csv(), (10, 10))
    assert np.allclose(back.positions, model.positions) and back.layout == model.layout
