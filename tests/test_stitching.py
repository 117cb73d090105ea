"""Grid stitching against synthetic truth: positions right to half a pixel."""

import numpy as np
import pytest

from plexgpu.image import stitching
from plexgpu import xp as xpmod
from plexgpu.io.raw import grid_layout
from plexgpu.image.phasecorr import phase_correlation
from plexgpu.image.subpixel import shift_fraction
from plexgpu.image.synth import SynthDataset, SynthSpec


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


@pytest.mark.parametrize("order", ["snake", "rows", "columns-bottom-right", "snake-columns-top-right"])
def test_positions_subpixel_with_a_rotated_camera(xp, order):
    """Sub-pixel stage jitter and a camera turned 1 deg (7 px across each step): positions to a
    fraction of a pixel, and the stage model carries the rotation."""
    ds = SynthDataset(SynthSpec(cycles=1, rows=4, cols=5, tile=(128, 160), z_planes=3, channels=1,
                                order=order, seed=4, jitter_px=2.0, rotation_deg=1.0))
    model = stitching.compute_model(_corrected_tiles(ds, xp), grid_layout(4, 5, order), ds.spec.overlap)
    err = _errors(model, ds)
    print(f"{order}: position error max {err.max():.3f}, median {np.median(err):.3f} px; {model.stage}")
    assert err.max() <= 0.3 and np.median(err) <= 0.1
    assert sum(p.accepted for p in model.pairs) >= 0.8 * len(model.pairs)  # bare slide may blank a few
    step = np.array(stitching.nominal_step((128, 160), ds.spec.overlap))
    truth = np.array(ds.positions[0])
    for d, nominal in (("h", [0, step[1]]), ("v", [step[0], 0])):    # the model: the pairs' median true step
        dev = [truth[p.b] - truth[p.a] - nominal for p in model.pairs if p.direction == d and p.clear]
        assert np.allclose(model.stage.deviation[d], np.median(dev, axis=0), atol=0.15)
    rotation = np.degrees(np.arctan2(model.stage.deviation["h"][0], step[1]))
    assert rotation == pytest.approx(1.0, abs=1.0)                  # jitter: 2 px per tile
    assert stitching.grid_problem(model.pairs) is None


@pytest.mark.parametrize("seed", [11, 5])
def test_five_percent_overlap_subpixel_and_no_wrong_pair(xp, seed):
    """Overlaps of 5 % (13 px of 256): phase correlation on strips cut at the nominal step put pairs
    1-2 px off (a tile 3.1 px off, 4 wrong pairs accepted); fitted on the exact overlap, every tile
    with an accepted pair within 0.5 px and no accepted pair more than 0.5 px from the truth (a tile
    whose pairs hold no texture is placed by the stage model: nothing in it can say where it is)."""
    spec = SynthSpec(cycles=1, rows=5, cols=6, tile=(256, 256), overlap=0.05, z_planes=3, channels=1, seed=seed,
                     jitter_px=3.0, rotation_deg=0.5)
    ds = SynthDataset(spec)
    layout = grid_layout(5, 6, "snake")
    model = stitching.compute_model(_corrected_tiles(ds, xp), layout, spec.overlap)
    placed = sorted({t for p in model.pairs if p.accepted for t in (p.a, p.b)})
    err = _errors(model, ds)[placed]
    truth = np.array(ds.positions[0])
    step = np.array(stitching.nominal_step(spec.tile, spec.overlap))
    wrong = [p for p in model.pairs if p.accepted and np.abs(
        truth[p.b] - truth[p.a] - (step * ([0, 1] if p.direction == "h" else [1, 0])) - (p.dy, p.dx)).max() > 0.5]
    accepted = sum(p.accepted for p in model.pairs)
    print(f"5 % overlap, seed {seed}: position error of the {len(placed)} tiles with an accepted pair max "
          f"{err.max():.2f}, median {np.median(err):.2f} px; "
          f"{accepted} of {len(model.pairs)} pairs accepted, {len(wrong)} more than 0.5 px wrong")
    assert err.max() <= 0.5 and not wrong and accepted >= len(model.pairs) / 2


def test_phase_correlation_subpixel_unbiased(xp):
    """Sub-pixel shifts of a band-limited image, with noise: no pull toward whole pixels."""
    from scipy import ndimage

    rng = np.random.default_rng(0)
    errors = []
    for _ in range(30):
        img = np.abs(ndimage.gaussian_filter(rng.standard_normal((200, 260)), 1.5)) * 100
        shift = rng.uniform(-3, 3, 2)
        moved = np.fft.ifft2(ndimage.fourier_shift(np.fft.fft2(img), shift)).real
        a, b = (x[40:90, 30:230] + rng.normal(0, 2, (50, 200)) for x in (img, moved))
        m = phase_correlation(xpmod.to_device(a, xp), xpmod.to_device(b, xp))
        errors.append(np.array([m.dy, m.dx]) - shift)
    errors = np.array(errors)
    print(f"bias {errors.mean(axis=0).round(4)}, rms {np.sqrt((errors ** 2).mean()):.4f}, max {np.abs(errors).max():.3f}")
    assert np.abs(errors.mean(axis=0)).max() <= 0.02
    assert np.sqrt((errors ** 2).mean()) <= 0.05


def test_batched_phase_correlation_is_each_pair_alone(xp):
    """Registration measures thousands of blocks in one batch: every pair of the batch must come out as it
    would alone (normalisation, peak search, noise statistics and the sub-pixel refinement per pair, none
    leaking between pairs), here with pairs 10^4 apart in brightness, a constant one and an odd size
    (whose frequencies are not powers of two)."""
    from scipy import ndimage

    from plexgpu.image.phasecorr import phase_correlation_batch

    rng = np.random.default_rng(3)
    a, b, truth = [], [], []
    for k in range(6):
        img = ndimage.gaussian_filter(rng.standard_normal((140, 150)), 1.5) * (100.0 if k % 2 else 0.01)
        shift = rng.uniform(-8, 8, 2)
        moved = np.fft.ifft2(ndimage.fourier_shift(np.fft.fft2(img), shift)).real
        a.append(img[10:111, 20:137])
        b.append(moved[10:111, 20:137] + rng.normal(0, 0.02 * img.std(), (101, 117)))
        truth.append(shift)
    a.append(np.full((101, 117), 5.0))
    b.append(b[0])
    stack_a, stack_b = (xpmod.to_device(np.array(s, np.float32), xp) for s in (a, b))
    for near, radius in ((None, None), ((0.0, 0.0), 25.0)):
        batch = phase_correlation_batch(stack_a, stack_b, near=near, radius=radius)
        for i in range(len(a)):
            alone = phase_correlation(xpmod.to_device(np.float32(a[i]), xp), xpmod.to_device(np.float32(b[i]), xp),
                                      near=near, radius=radius)
            assert batch[i].dy == pytest.approx(alone.dy, abs=1e-3) and batch[i].dx == pytest.approx(alone.dx, abs=1e-3)
            assert batch[i].significance == pytest.approx(alone.significance, rel=1e-4)
            assert batch[i].ambiguity == pytest.approx(alone.ambiguity, abs=1e-4) and batch[i].n == alone.n
            if i < len(truth):
                assert np.hypot(batch[i].dy - truth[i][0], batch[i].dx - truth[i][1]) <= 0.1
    assert batch[-1].significance == 0.0 and batch[-1].ambiguity == 1.0       # the constant block: no match


def test_stage_model_ignores_outlier_pairs():
    pairs = [stitching.Pair(i, i + 1, "h", 7.6 + 0.1 * np.sin(i), -0.2) for i in range(12)]
    pairs += [stitching.Pair(i, i + 9, "v", 0.1, -7.7 + 0.1 * np.cos(i)) for i in range(12)]
    pairs += [stitching.Pair(30, 31, "h", 45.0, -120.0), stitching.Pair(32, 33, "v", -80.0, 3.0)]  # chance matches
    stage = stitching.fit_stage_model(pairs)
    assert stage.deviation["h"] == pytest.approx((7.6, -0.2), abs=0.1)
    assert stage.deviation["v"] == pytest.approx((0.1, -7.7), abs=0.1)
    assert stage.spread < 0.2 and stage.window == stitching.MIN_WINDOW_PX
    assert stitching.fit_stage_model(pairs, max_shift_px=6).window == 6


def test_wrong_grid_with_the_right_tile_count_is_refused(xp):
    """A 4 x 4 acquisition given as 2 x 8: neighbours that are not; the gate says why."""
    ds = SynthDataset(SynthSpec(cycles=1, rows=4, cols=4, tile=(128, 128), z_planes=3, channels=1, seed=9,
                                tissue_fraction=1.0))
    tiles = _corrected_tiles(ds, xp)
    right = stitching.compute_model(tiles, grid_layout(4, 4, "snake"), ds.spec.overlap)
    assert stitching.grid_problem(right.pairs) is None
    wrong = stitching.compute_model(tiles, grid_layout(2, 8, "snake"), ds.spec.overlap)
    problem = stitching.grid_problem(wrong.pairs)
    print(problem)
    assert problem and "carry tissue match" in problem


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


def test_blend_places_tiles_at_their_subpixel_positions(xp):
    """The mosaic built from positions is the specimen at those positions: registered against the
    specimen it is off by <= 0.05 px (whole-pixel placement was up to 0.71 px off), and flat
    areas keep their intensity (cubic convolution keeps flux)."""
    spec = SynthSpec(cycles=1, rows=2, cols=3, tile=(128, 128), z_planes=3, channels=1, seed=6,
                     poisson=False, read_noise=0.0, jitter_px=2.0, tissue_fraction=1.0)
    ds = SynthDataset(spec)
    flat, dark = ds.flatfield(1, 2), ds.darkfield(1, 2)
    tiles = [xpmod.to_device((t - dark) / flat, xp) for t in ds.expected_tiles(1, 1, 2)]
    truth = np.array(ds.positions[0], float)
    assert not np.allclose(truth, np.rint(truth))
    origin = truth.min(0)
    model = stitching.StitchModel(layout=grid_layout(2, 3, "snake"), tile_shape=(128, 128), positions=truth - origin)
    mosaic = xpmod.to_host(stitching.blend(tiles, model))
    plane = ds.amplitude(1) * ds.stack(1, 1)[1]
    y0, x0 = np.floor(origin).astype(int)
    expect = plane[y0:y0 + mosaic.shape[0], x0:x0 + mosaic.shape[1]]
    inner = (slice(8, -8), slice(8, -8))
    m = phase_correlation(expect[inner], mosaic[inner])   # mosaic[y] ~ expect[y - dy]: dy = -(origin fraction)
    frac = origin - np.floor(origin)
    err = np.abs(np.array([m.dy, m.dx]) + frac).max()
    print(f"mosaic vs positions: {err:.3f} px (fraction of the origin {frac.round(3)})")
    assert err <= 0.05
    assert abs(mosaic[inner].mean() / expect[inner].mean() - 1) < 0.005
    covered = np.zeros(mosaic.shape, bool)
    for y, x in model.placement:
        covered[y:y + 128, x:x + 128] = True
    assert (mosaic[~covered] == 0).all()


def test_shift_fraction_matches_spline_interpolation(xp):
    from scipy import ndimage

    img = ndimage.gaussian_filter(np.random.default_rng(0).standard_normal((80, 80)), 3).astype(np.float32)
    for frac in ((0.3, 0.0), (0.0, 0.7), (0.5, 0.25)):
        out = xpmod.to_host(shift_fraction(xpmod.to_device(img, xp), frac))
        ref = ndimage.shift(img, frac, order=3, mode="nearest")
        assert np.abs(out - ref)[4:-4, 4:-4].max() < 2e-3 * np.abs(img).max()
    assert np.array_equal(xpmod.to_host(shift_fraction(xpmod.to_device(img, xp), (0.0, 0.0))), img)


def test_positions_csv_roundtrip():
    model = stitching.StitchModel(layout=[(0, 0), (0, 1)], tile_shape=(10, 10),
                                  positions=np.array([[0.0, 0.0], [0.25, 7.5]]))
    back = stitching.StitchModel.from_positions_csv(model.positions_csv(), (10, 10))
    assert np.allclose(back.positions, model.positions) and back.layout == model.layout


def test_stitch_job_with_a_wrong_grid_fails_in_one_line(tmp_path):
    """The stitch stage refuses a 4 x 4 acquisition stitched as 2 x 8, naming the grid keys and the
    pairs file it wrote first; nothing that looks like a mosaic is left."""
    from dataclasses import replace

    from plexgpu import stages
    from plexgpu.config import validate_config
    from plexgpu.experiment import cycle_spec, resolve_experiment
    from plexgpu.job import job_context

    SynthDataset(SynthSpec(cycles=1, rows=4, cols=4, tile=(128, 128), z_planes=3, channels=1, seed=9,
                           tissue_fraction=1.0)).write(tmp_path / "raw")
    config = validate_config({"raw_dir": str(tmp_path / "raw"), "results_dir": str(tmp_path / "res")})
    spec = replace(cycle_spec(resolve_experiment(config), 1), rows=2, cols=8)
    res = tmp_path / "res"
    res.mkdir()
    out = {"stitched": [str(res / "CH1.ome.tif")], "profiles": [str(res / "CH1.profiles.tif")],
           "positions": str(res / "positions.csv"), "pairs": str(res / "pairs.csv"), "planes": str(res / "planes.json"),
           "defects": str(res / "defects.csv")}
    with pytest.raises(stitching.StitchQualityError) as err:
        with job_context("stitch", str(tmp_path / "stitch.log"), {"cpus_per_task": 1}, "cpu") as ctx:
            stages.stitch(ctx, spec, config["basic"], config["stitch"], out)
    msg = str(err.value)
    print(msg)
    assert "\n" not in msg and "grid.rows x grid.cols (2x8)" in msg and "grid.order" in msg and "pairs.csv" in msg
    assert (res / "pairs.csv").is_file() and not (res / "CH1.ome.tif").exists()
