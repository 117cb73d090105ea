"""PSF from the optics and Richardson-Lucy: physically right, equal to scikit-image."""

import numpy as np
import pytest
from scipy.signal import fftconvolve

from plexgpu.image import deconvolution as dc
from plexgpu.image import psf
from plexgpu import xp as xpmod


def codex_optics(nm, model="born_wolf"):
    return psf.Optics(pixel_size_um=0.377, z_step_um=1.5, na=0.75, immersion_index=1.0, sample_index=1.33,
                      emission_nm=nm, model=model)


@pytest.mark.parametrize("nm", [450, 520, 570, 670, 700])
def test_psf_fwhm_matches_textbook(nm):
    o = codex_optics(nm)
    r = np.linspace(0, 1.5, 3001)
    z = np.linspace(0, 6, 2401)
    lateral = psf.fwhm(psf.radial_profile(o, r, np.array([0.0]))[0], r[1] - r[0])
    axial = psf.fwhm(psf.radial_profile(o, np.array([0.0]), z)[:, 0], z[1] - z[0])
    lam = nm / 1000
    textbook_lateral = 0.51 * lam / 0.75                       # widefield, 0.51 λ/NA
    textbook_axial = 0.88 * lam / (1.0 - np.sqrt(1.0 - 0.75 ** 2))  # widefield, 0.88 λ/(n - sqrt(n² - NA²))
    print(f"{nm} nm: lateral {lateral:.3f} µm (textbook {textbook_lateral:.3f}), axial {axial:.3f} µm "
          f"(textbook {textbook_axial:.3f})")
    assert abs(lateral / textbook_lateral - 1) < 0.10
    assert abs(axial / textbook_axial - 1) < 0.10


def test_psf_sampled_on_image_grid():
    o = codex_optics(520)
    hz, hxy = psf.default_half_size(o, 5)
    p = psf.psf(o, hz, hxy)
    assert p.shape == (2 * hz + 1, 2 * hxy + 1, 2 * hxy + 1)
    assert abs(float(p.sum()) - 1) < 1e-5
    assert np.unravel_index(np.argmax(p), p.shape) == (hz, hxy, hxy)
    # central plane's FWHM in pixels: ~1 pixel at 0.377 µm, never ~3x too wide
    fw_px = psf.fwhm(p[hz, hxy, hxy:], 1.0)
    assert 0.7 < fw_px < 1.6
    # adjacent planes are one z step away: axial FWHM ~1 z-step
    fz = psf.fwhm(p[hz:, hxy, hxy], 1.0)
    assert 0.6 < fz < 1.6


def test_gibson_lanni_differs_with_depth_and_mismatch():
    bw = psf.psf(codex_optics(520), 3, 12)
    gl = psf.psf(psf.Optics(0.377, 1.5, 0.75, 1.0, 1.33, 520, model="gibson_lanni", depth_um=10.0), 3, 12)
    assert np.abs(bw - gl).max() > 1e-3
    assert abs(float(gl.sum()) - 1) < 1e-5


def _beads(z=48, n=3000, size=128, seed=0):
    rng = np.random.default_rng(seed)
    truth = np.full((z, size, size), 20.0, np.float32)
    idx = rng.integers(0, size, (n, 2))
    truth[rng.integers(0, z, n), idx[:, 0], idx[:, 1]] += rng.uniform(100, 1000, n)
    return truth


@pytest.fixture(scope="module")
def blurred():
    p = psf.psf(codex_optics(520), 2, 8)
    img = np.clip(fftconvolve(_beads(), p, mode="same"), 0, None).astype(np.float32)
    return img, p


def test_rl_equals_skimage_in_interior(blurred, xp):
    from skimage.restoration import richardson_lucy

    img, p = blurred
    ours = xpmod.to_host(dc.richardson_lucy(xpmod.to_device(img, xp), p, 5))
    ref = richardson_lucy(img, p, num_iter=5, clip=False)
    interior = (slice(14, -14), slice(32, -32), slice(32, -32))
    rel = np.abs(ours[interior] - ref[interior]).max() / np.abs(ref[interior]).max()
    print(f"max relative difference to skimage in the interior: {rel:.1e}")
    assert rel <= 1e-3


def test_rl_flux_kept_and_sharpens(blurred, xp):
    img, p = blurred
    out = xpmod.to_host(dc.richardson_lucy(xpmod.to_device(img, xp), p, 20))
    assert out.dtype == np.float32
    # no rescaling to the dtype range; the recorded planes gain the light of theirs that the stack did not
    # record (it left through the top and bottom planes), and lose what came from beyond them
    assert abs(out.sum() / img.sum() - 1) < 0.03
    assert out.max() > 1.5 * img.max()                    # it deconvolves


def test_rl_with_negative_read_noise_stays_finite(blurred, xp):
    img, p = blurred
    noisy = img - 20 + np.random.default_rng(3).normal(0, 3, img.shape).astype(np.float32)  # offset subtracted
    assert (noisy < 0).mean() > 0.2
    out = xpmod.to_host(dc.richardson_lucy(xpmod.to_device(noisy, xp), p, 25))
    assert np.isfinite(out).all() and out.min() >= 0
    assert out.max() < 10 * img.max()
    assert abs(out.sum() / np.clip(noisy, 0, None).sum() - 1) < 0.03   # as in test_rl_flux_kept_and_sharpens


def test_chunked_equals_whole(blurred, xp):
    img, p = blurred
    whole = xpmod.to_host(dc.richardson_lucy(xpmod.to_device(img, xp), p, 10))
    chunked = dc.deconvolve(img, p, 10, chunk_px=48, xp=xp)
    diff = np.abs(chunked - whole) / np.abs(whole).max()
    band = 2 * (p.shape[1] // 2)  # the mosaic border, where each piece's mirror padding differs
    inner = diff[:, band:-band, band:-band].max()
    print(f"chunked vs whole: max relative difference {inner:.1e} (border band {diff.max():.1e})")
    assert inner <= 1e-4          # seams between chunks are invisible
    assert diff.max() <= 5e-3 and diff.mean() <= 1e-4


def test_zero_iterations_is_identity(blurred):
    img, p = blurred
    assert np.array_equal(dc.richardson_lucy(img, p, 0), img)


def test_z_beyond_the_stack_is_unrecorded_not_a_mirror(xp):
    """Light from a sheet just above the recorded planes (a widefield PSF as deep as the stack): a mirrored
    stack made it a copy inside the recorded planes; RL now puts it where it came from, beyond them."""
    assert dc.padded_shape((8, 100, 100), (15, 25, 25))[0] >= 8 + 2 * 7     # the estimate extends by the half depth
    p = psf.psf(codex_optics(520), 6, 12)                                   # 13 planes
    specimen = np.zeros((9 + 12, 64, 64), np.float32)
    specimen[3, 20:44, 20:44] = 1000.0                                      # 3 planes above the recorded 6..14
    recorded = np.clip(fftconvolve(specimen, p, mode="same"), 0, None)[6:15].astype(np.float32)
    out = xpmod.to_host(dc.richardson_lucy(xpmod.to_device(recorded, xp), p, 25))
    assert out.sum() < 0.5 * recorded.sum(), out.sum() / recorded.sum()     # mirrored: 0.99 of it stayed inside
    inside = np.zeros((9, 64, 64), np.float32)
    inside[4, 20:44, 20:44] = 1000.0                                        # and a sheet inside stays inside
    rec = np.clip(fftconvolve(inside, p, mode="same"), 0, None).astype(np.float32)
    out = xpmod.to_host(dc.richardson_lucy(xpmod.to_device(rec, xp), p, 25))
    assert int(out.sum(axis=(1, 2)).argmax()) == 4 and abs(out.sum() / inside.sum() - 1) < 0.1, out.sum(axis=(1, 2))


def test_computed_psf_is_cut_round_not_square():
    o = codex_optics(520)
    p = psf.psf(o, 12, 20)                                  # a deep defocus cone in a small box
    half = 20
    yy, xx = np.mgrid[-half:half + 1, -half:half + 1]
    outside = np.hypot(yy, xx) > half + 0.5
    assert float(p[:, outside].max()) == 0.0                # the box's corners hold nothing
    rim = np.abs(np.hypot(yy, xx) - 0.9 * half) < 0.7       # a ring inside the taper: the same all round
    ring = p[0][rim]
    assert ring.std() < 0.2 * ring.mean()


def _bead(realdata):
    from plexgpu.io.tiff import read_tiff

    return (read_tiff(realdata / "bead" / "bead.tif").astype(np.float32),
            read_tiff(realdata / "bead" / "kernel.tif").astype(np.float32))


def test_measured_psf_from_file_resampled_and_normalised(realdata, tmp_path):
    import tifffile

    _, kernel = _bead(realdata)
    fine = tifffile.imwrite  # noqa: F841 (tifffile imported for the OME writer below)
    path = tmp_path / "psf.ome.tif"
    tifffile.imwrite(path, kernel + 5.0, metadata={"axes": "ZYX", "PhysicalSizeZ": 0.1, "PhysicalSizeY": 0.05,
                                                   "PhysicalSizeX": 0.05})
    p = psf.measured(path, None, z_step_um=0.2, pixel_size_um=0.1)   # data sampled twice as coarse
    assert p.shape[0] % 2 == 1 and p.shape[1] % 2 == 1
    assert abs(float(p.sum()) - 1) < 1e-5 and p.min() >= 0
    assert np.unravel_index(np.argmax(p), p.shape) == tuple(n // 2 for n in p.shape)
    assert 30 <= p.shape[1] <= 34                            # 64 px at 0.05 um -> ~32 at 0.1 um
    with pytest.raises(psf.PSFError, match="deconvolution.psf_file: .*no PhysicalSizeZ/Y/X.*psf_voxel_um"):
        tifffile.imwrite(tmp_path / "bare.tif", kernel)
        psf.measured(tmp_path / "bare.tif", None, 0.2, 0.1)
    with pytest.raises(psf.PSFError, match="must be a z-stack"):
        tifffile.imwrite(tmp_path / "flat.tif", kernel[0])
        psf.measured(tmp_path / "flat.tif", (1, 1, 1), 1, 1)


def test_rl_with_the_bead_psf_keeps_the_hollow_shell(realdata, tmp_path, xp):
    """bead/: a real hollow bead (a ring in its plane 25: centre 0.81 of the ring) and its PSF. A
    known-truth copy (the bead blurred by the PSF, with noise) deconvolved with the PSF read
    through the file path comes closer to the bead than the blurred copy, and the shell stays
    hollow (a zero-boundary RL collapses it into a spike)."""
    import tifffile

    bead, kernel = _bead(realdata)
    path = tmp_path / "kernel.tif"
    tifffile.imwrite(path, kernel)
    k = psf.measured(path, (1.0, 1.0, 1.0), z_step_um=1.0, pixel_size_um=1.0)
    pad = [(0, 64 - n) for n in k.shape]
    otf = np.fft.rfftn(np.roll(np.pad(k, pad), [-(n // 2) for n in k.shape], axis=(0, 1, 2)))
    blurred = np.fft.irfftn(np.fft.rfftn(bead) * otf, s=bead.shape)
    rng = np.random.default_rng(0)
    blurred = np.clip(blurred + rng.normal(0, 0.01 * blurred.max(), blurred.shape), 0, None).astype(np.float32)
    out = xpmod.to_host(dc.richardson_lucy(xpmod.to_device(blurred, xp), k, 25))
    def rel(a):
        return a / a.sum()
    def err(a):
        return float(np.sqrt(np.mean((rel(a) - rel(bead)) ** 2)) / np.sqrt(np.mean(rel(bead) ** 2)))
    def hollow(a):
        return float(a[25, 31, 29:34].min() / a[25, 31, 22:41].max())   # centre over the ring
    print(f"error vs the bead: blurred {err(blurred):.3f}, RL 25 {err(out):.3f}; centre/ring: bead "
          f"{hollow(bead):.2f}, blurred {hollow(blurred):.2f}, RL {hollow(out):.2f}")
    assert err(out) < 0.8 * err(blurred)
    assert hollow(out) < hollow(blurred) and hollow(out) < 0.95     # the ring keeps its hollow middle


def test_padded_voxels_sums_every_chunks_fft_volume():
    """What the GPU budget scales RL's traffic by (bench/gpu_budget.py): one piece when the chunk holds
    the stack, more (their halos counted twice) when it is cut."""
    shape, psf_shape = (6, 300, 200), (11, 31, 31)
    whole = dc.padded_voxels(shape, psf_shape, 400, 45)
    assert whole == int(np.prod(dc.padded_shape(shape, psf_shape)))
    cut = dc.padded_voxels(shape, psf_shape, 100, 45)
    pieces = [(6, ry.stop - ry.start, rx.stop - rx.start) for ry, _, _ in dc.chunk_slices(300, 100, 45)
              for rx, _, _ in dc.chunk_slices(200, 100, 45)]
    assert len(pieces) == 6 and cut == sum(int(np.prod(dc.padded_shape(p, psf_shape))) for p in pieces)
    assert cut > whole


def _high_band_error(image, truth):
    """Relative error of the image's Fourier coefficients above half Nyquist against the truth's, after
    one least-squares scale (Hann window, means off): blur and noise both count."""
    win = np.outer(np.hanning(image.shape[0]), np.hanning(image.shape[1]))
    fa, fb = (np.fft.rfft2((v - v.mean()) * win) for v in (image, truth))
    s = np.real(np.vdot(fa, fb)) / np.vdot(fa, fa).real
    high = np.hypot(np.fft.fftfreq(image.shape[0])[:, None], np.fft.rfftfreq(image.shape[1])[None, :]) >= 0.25
    return float(np.sum(np.abs(s * fa[high] - fb[high]) ** 2) / np.sum(np.abs(fb[high]) ** 2))


@pytest.mark.parametrize("thickness", [0.0, 6.0])
def test_default_deconvolution_brings_the_edf_closer_to_the_sharp_specimen(thickness):
    """The deconvolve stage's default kernel (deconvolution.method: lateral, the PSF's in-focus plane) then
    the EDF is closer to the sharp specimen than the plain EDF, overall and in fine detail, and keeps
    each cell's light; the whole PSF in 3-D (method volume, the old default) was further from it than the
    plain EDF (a widefield stack cannot place a section's slowly varying light at its depth)."""
    from scipy import ndimage

    from plexgpu.config import validate_config
    from plexgpu.image import edf
    from plexgpu.image.synth import SynthDataset, SynthSpec
    from plexgpu.stages import kernel_for

    ds = SynthDataset(SynthSpec(cycles=1, rows=2, cols=2, tile=(128, 128), z_planes=7, channels=1, seed=9,
                                thickness_um=thickness))
    rng = np.random.default_rng(0)
    data = np.clip(rng.poisson(ds.stack(1, 1) * ds.amplitude(1)) + rng.normal(0, 3, ds.stack(1, 1).shape), 0,
                   None).astype(np.float32)
    cfg = validate_config({"raw_dir": "raw"})["deconvolution"]
    o = ds.optics(1)

    class Spec:                                        # what kernel_for reads of a cycle
        z_step_um, pixel_size_um = o.z_step_um, o.pixel_size_um
    results = {}
    for method in ("lateral", "volume"):
        kernel = kernel_for(Spec, o, {**cfg, "method": method}, 1, data.shape[0])
        results[method] = edf.extended_depth_of_field(dc.richardson_lucy(data, kernel, cfg["iterations"])).image
    results["plain"] = edf.extended_depth_of_field(data).image
    truth = ds.specimen(1, 1)
    inner = (slice(16, -16), slice(16, -16))
    r = {k: float(np.corrcoef(v[inner].ravel(), truth[inner].ravel())[0, 1]) for k, v in results.items()}
    fine = {k: _high_band_error(v[inner], truth[inner]) for k, v in results.items()}
    cells = ndimage.grey_dilation(ds.frame(1, ds.nucleus_labels), size=5)
    ids = np.unique(cells[24:-24, 24:-24])
    ids = ids[(ids > 0) & (ndimage.sum_labels(truth, cells, np.maximum(ids, 1)) > 0)]

    def spread(img):
        q = ndimage.sum_labels(img, cells, ids) / ndimage.sum_labels(truth, cells, ids)
        q = q / np.median(q)
        return float(np.percentile(q, 95) - np.percentile(q, 5))
    print({k: (round(r[k], 4), round(fine[k], 3), round(spread(results[k]), 3)) for k in results})
    assert cfg["method"] == "lateral"
    assert r["lateral"] > r["plain"] + 0.002
    assert fine["lateral"] < fine["plain"] - 0.02
    assert spread(results["lateral"]) <= spread(results["plain"]) + 0.01
    assert r["volume"] < r["plain"]                    # what the default no longer does


def test_in_focus_kernel_is_the_sharpest_plane_cut_and_normalised():
    o = codex_optics(520)
    full = psf.psf(o, *psf.default_half_size(o, 9))
    k = psf.in_focus(full, o)
    hz = full.shape[0] // 2
    assert k.shape[0] == 1 and k.shape[1] == k.shape[2] and k.shape[1] < full.shape[1]
    assert abs(float(k.sum()) - 1) < 1e-5
    h = k.shape[1] // 2
    c = full.shape[1] // 2
    ref = full[hz, c - h:c + h + 1, c - h:c + h + 1]
    np.testing.assert_allclose(k[0], ref / ref.sum(), rtol=1e-4, atol=1e-7)
    shifted = np.roll(full, 2, axis=0)                 # a bead's best focus off the middle plane: found there
    np.testing.assert_allclose(psf.in_focus(shifted, o), k, rtol=1e-4, atol=1e-7)
