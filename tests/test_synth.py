"""The synthetic dataset: deterministic bytes and consistent ground truth."""

import hashlib
from dataclasses import replace

import numpy as np
import pytest
from scipy import ndimage

from plexgpu.io.raw import tile_filename
from plexgpu.io.tiff import read_tiff
from plexgpu.image.synth import SynthDataset, SynthSpec, load_truth


def _digest(folder):
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_same_arguments_identical_bytes(tmp_path):
    spec = SynthSpec(cycles=2, rows=2, cols=2, tile=(64, 64), z_planes=3, channels=2, seed=7)
    SynthDataset(spec).write(tmp_path / "a")
    SynthDataset(spec).write(tmp_path / "b")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    SynthDataset(SynthSpec(cycles=2, rows=2, cols=2, tile=(64, 64), z_planes=3, channels=2, seed=8)).write(tmp_path / "c")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


def test_tiles_are_the_shaded_expected_tiles_plus_noise(tmp_path):
    spec = SynthSpec(cycles=2, rows=2, cols=3, tile=(64, 80), z_planes=3, channels=2, seed=1,
                     poisson=False, read_noise=0.0)
    SynthDataset(spec).write(tmp_path)
    ds, truth = load_truth(tmp_path)
    for cycle in (1, 2):
        for ch in (1, 2):
            for z in (1, 3):
                for t, expect in enumerate(ds.expected_tiles(cycle, ch, z), start=1):
                    raw = read_tiff(tmp_path / f"cyc{cycle:03d}_reg001" / tile_filename(1, t, z, ch)).astype(np.float32)
                    assert np.abs(raw - np.clip(expect, 0, 65535)).max() <= 0.5 + 1e-3


def test_whole_pixel_tiles_are_crops_of_the_stack():
    spec = SynthSpec(cycles=2, rows=2, cols=3, tile=(64, 80), z_planes=3, channels=1, seed=1, jitter_px=0,
                     cycle_shift_px=0)
    ds = SynthDataset(spec)
    for cycle in (1, 2):
        stack = ds.stack(cycle, 1)
        flat, dark = ds.flatfield(1, 2), ds.darkfield(1, 2)
        for tile, (y, x) in zip(ds.expected_tiles(cycle, 1, 2), ds.positions[cycle - 1]):
            assert float(y).is_integer() and float(x).is_integer()
            expect = ds.amplitude(1) * stack[1, int(y):int(y) + 64, int(x):int(x) + 80]
            np.testing.assert_allclose((tile - dark) / flat, expect, atol=1e-2)


def test_subpixel_jitter_and_camera_rotation_are_in_the_truth():
    """Neighbouring tiles overlap where the truth positions (camera axes) say, to a few hundredths
    of a pixel, with Gaussian stage jitter, sub-pixel cycle shifts and a camera turned by 1 degree."""
    from plexgpu.image.phasecorr import phase_correlation

    spec = SynthSpec(cycles=2, rows=2, cols=2, tile=(128, 128), z_planes=3, channels=1, seed=3, jitter_px=2.0,
                     rotation_deg=1.0, overlap=0.25, tissue_fraction=1.0)
    ds = SynthDataset(spec)
    pos = np.array(ds.positions[1])
    assert not np.allclose(pos, np.rint(pos)), "positions must be sub-pixel"
    assert not float(ds.cycle_shifts[1][0]).is_integer()
    tiles = [(t - ds.darkfield(1, 2)) / ds.flatfield(1, 2) for t in ds.expected_tiles(2, 1, 2)]
    errors = []
    for a, b in ((0, 1), (0, 3)):          # tile 1 | tile 2 (right), tile 1 / tile 4 (below, snake)
        d = pos[b] - pos[a]
        iy, ix = int(np.floor(d[0])), int(np.floor(d[1]))
        ha, wa = 128 - abs(iy), 128 - abs(ix)
        sa = tiles[a][max(iy, 0):max(iy, 0) + ha, max(ix, 0):max(ix, 0) + wa]
        sb = tiles[b][max(-iy, 0):max(-iy, 0) + ha, max(-ix, 0):max(-ix, 0) + wa]
        m = phase_correlation(sa, sb)      # what is left after the whole-pixel crop: the fraction
        errors.append(np.abs(np.array([-m.dy, -m.dx]) - (d - [iy, ix])).max())
    print("sub-pixel residuals", np.round(errors, 3))
    assert max(errors) < 0.05
    # the rotation shows as a perpendicular offset of ~ step * sin(1 deg) between neighbours
    assert abs((pos[1] - pos[0])[0]) > 0.5 * spec.step[1] * np.sin(np.radians(1.0)) - 2 * 2 * spec.jitter_px


def test_truth_features():
    ds = SynthDataset(SynthSpec(cycles=3, rows=2, cols=2, tile=(64, 64), z_planes=5, channels=3, seed=2))
    assert ds.cycle_shifts[0] == (0, 0) and any(s != (0, 0) for s in ds.cycle_shifts[1:])
    assert all(max(abs(v) for v in s) <= ds.spec.cycle_shift_px for s in ds.cycle_shifts)
    # flatfield mean 1, differs between z-planes of one channel (why BaSiC runs per plane)
    f1, f5 = ds.flatfield(2, 1), ds.flatfield(2, 5)
    assert abs(f1.mean() - 1) < 1e-5 and np.abs(f1 - f5).max() > 0.02
    # depth varies across the field, and the in-focus plane is the sharpest
    depth = ds.depth_map(1)
    assert depth.max() - depth.min() > 1.0
    stack = ds.stack(1, 1)
    sharp = ds.specimen(1, 1)
    iz = np.clip(np.rint(depth), 0, 4).astype(int)
    best = np.take_along_axis(stack, iz[None], 0)[0]
    assert np.corrcoef(best.ravel(), sharp.ravel())[0, 1] > 0.99
    # sparse marker channel covers far less area than the nuclear stain
    assert (ds.specimen(1, 2) > 0.2).mean() < 0.5 * (ds.specimen(1, 1) > 0.2).mean()
    # positions are on the nominal grid up to the jitter
    (sy, sx) = ds.spec.step
    pos = np.array(ds.positions[0])
    assert np.abs(pos[1] - pos[0] - [0, sx]).max() <= 4 * ds.spec.jitter_px   # each tile within 2 std


def test_sheet_between_planes_is_imaged_at_its_own_defocus():
    """A sheet halfway between planes 1 and 2 is seen by both at 0.75 µm defocus: the same image
    in both, and not half in focus plus half at 1.5 µm (two half-sheets on the recorded planes)."""
    from scipy import signal

    from plexgpu.image.synth import DEPTH_LEVELS, image_sheet

    ds = SynthDataset(SynthSpec(cycles=1, rows=1, cols=1, tile=(96, 96), z_planes=4, channels=1, seed=4))
    sharp = ds.specimen(1, 1)
    fine = ds.fine_psf(1)
    coarse = ds.psf(1)
    hz, hzf = coarse.shape[0] // 2, fine.shape[0] // 2
    np.testing.assert_allclose(fine[::DEPTH_LEVELS], coarse, atol=1e-6 * coarse.max())
    stack = image_sheet(sharp, np.full(sharp.shape, 1.5, np.float32), fine, 4)

    def blur(kernel):
        pad = kernel.shape[0] // 2
        big = np.pad(sharp, pad, mode="reflect")
        return signal.fftconvolve(big, kernel, mode="same")[pad:-pad, pad:-pad]

    half_step = blur(fine[hzf + DEPTH_LEVELS // 2])
    two_half_sheets = 0.5 * (blur(coarse[hz]) + blur(coarse[hz + 1]))
    inner = (slice(20, -20), slice(20, -20))
    np.testing.assert_allclose(stack[1], stack[2], atol=1e-4 * stack.max())
    err = np.abs(stack[1] - half_step)[inner].max() / half_step.max()
    split = np.abs(two_half_sheets - half_step)[inner].max() / half_step.max()
    print(f"half-step sheet: error {err:.1e}; two half-sheets would differ by {split:.1e}")
    assert err < 1e-4 and split > 100 * err, (err, split)
    # the Born-Wolf PSF at 0.75 µm defocus has a lower peak than in focus, so the sheet looks dimmer
    assert half_step.max() < blur(coarse[hz]).max()
    # a sheet on a plane is that plane's in-focus image
    on_plane = image_sheet(sharp, np.full(sharp.shape, 2.0, np.float32), fine, 4)
    np.testing.assert_allclose(on_plane[2][inner], blur(coarse[hz])[inner], atol=1e-4 * stack.max())


def test_thick_slab_keeps_the_light_and_is_hazier_than_a_sheet():
    from plexgpu.image.synth import image_sheet

    ds = SynthDataset(SynthSpec(cycles=1, rows=1, cols=1, tile=(96, 96), z_planes=7, channels=1, seed=4))
    sharp, fine = ds.specimen(1, 1), ds.fine_psf(1)
    depth = np.full(sharp.shape, 3.0, np.float32)
    sheet = image_sheet(sharp, depth, fine, 7)
    thin = image_sheet(sharp, depth, fine, 7, thickness=0.01)
    slab = image_sheet(sharp, depth, fine, 7, thickness=2.0)        # 3 µm deep, centred on plane 3
    assert np.abs(thin - sheet).max() < 1e-2 * sheet.max()           # a slab tends to the sheet
    np.testing.assert_allclose(slab.sum(axis=(1, 2)), sheet.sum(axis=(1, 2)), rtol=3e-3)  # same light
    np.testing.assert_allclose(slab, slab[::-1], atol=1e-5 * slab.max())                  # symmetric about its centre
    truth = ds.in_focus(1, 1)
    inner = (slice(12, -12), slice(12, -12))           # in_focus is blurred on the canvas: borders differ
    def corr(a):
        return np.corrcoef(a[inner].ravel(), truth[inner].ravel())[0, 1]
    assert corr(sheet[3]) > 0.9999 and corr(slab[3]) < 0.995         # its own out-of-focus light lies on it
    spec = SynthSpec(cycles=1, rows=1, cols=1, tile=(64, 64), z_planes=5, channels=1, thickness_um=3.0)
    thick, thin = SynthDataset(spec).stack(1, 1), SynthDataset(replace(spec, thickness_um=0.0)).stack(1, 1)
    np.testing.assert_allclose(thick.sum(), thin.sum(), rtol=0.05)
    with pytest.raises(ValueError, match="thickness_um must be >= 0"):
        replace(spec, thickness_um=-1.0)


def test_blank_marker_dim_light_and_another_cycles_frame():
    """A marker named Blank shows the tissue's own light only; brightness scales the counts; in_focus can
    be cut in another cycle's frame (where registration puts the cycle): the same specimen, moved by the
    difference of the two cycles' shifts."""
    spec = SynthSpec(cycles=2, rows=2, cols=2, tile=(64, 64), z_planes=3, channels=2, seed=3,
                     markers=("DAPI", "CD3", "DAPI", "Blank"))
    ds = SynthDataset(spec)
    stained, blank, dapi = ds.canvas_specimen(1, 2), ds.canvas_specimen(2, 2), ds.canvas_specimen(2, 1)
    autofluorescence = np.where(ds.blank_mask, 0.0, ds.autofluorescence * 0.7 * ds.tissue)
    np.testing.assert_allclose(blank, autofluorescence, atol=1e-6)
    assert stained.max() > 5 * blank.max() and dapi.max() > 5 * blank.max()
    dim = SynthDataset(replace(spec, brightness=0.1))
    assert dim.amplitude(1) == pytest.approx(0.1 * ds.amplitude(1))
    with pytest.raises(ValueError, match="brightness > 0"):
        replace(spec, brightness=0.0)
    own, moved = ds.in_focus(2, 1), ds.in_focus(2, 1, frame_of=1)
    (y2, x2), (y1, x1) = ds.frame_origin(2), ds.frame_origin(1)
    back = ndimage.shift(moved, (y1 - y2, x1 - x2), order=3)
    inner = (slice(16, -16), slice(16, -16))
    assert np.corrcoef(back[inner].ravel(), own[inner].ravel())[0, 1] > 0.999
    assert np.corrcoef(moved[inner].ravel(), own[inner].ravel())[0, 1] < 0.99
