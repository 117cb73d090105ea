"""Does Richardson-Lucy before the EDF bring the image closer to the specimen? Judged against the
SHARP specimen (the synthetic section before any optics), not against its in-focus widefield image
(a sharpened image is further from a blurred truth by construction).

  python bench/decon_edf.py [--z 9] [--tile 256] [--thickness 0,3,6] [--iterations 5,10,25,50]

Cases: a thin section (a tilted, curved sheet), 3 and 6 µm slabs (out-of-focus haze from the
section's own depth), bare slide around the tissue, Poisson + read noise clipped at 0 as the uint16
mosaic is; and a thin section imaged at NA 0.6 but deconvolved with the NA 0.75 PSF the config
describes (a PSF that is not the optics'). Per image:

* r: correlation with the sharp specimen (inner region);
* band errors: per spatial-frequency band (fractions of Nyquist, Hann-windowed) the relative error
  |s A - T|^2 / |T|^2 of the image's Fourier coefficients against the truth's, s one least-squares
  scale for the whole image: 0 = the specimen's structure at those scales exactly, blur and noise both
  count (the high band is where deconvolution should help if anywhere);
* per cell: integrated intensity (nucleus + 2 px ring, in tissue, away from the border) over the
  truth's, normalised by the median cell, 5th-95th percentile over the cells (1.00-1.00 is
  quantitative).

Real data: the pollen stack of ../shared/realdata (a 3-D specimen, its truth known), each method's EDF
and maximum projection against the truth's maximum projection.

Images: the plain EDF (what `plex.ome.tif` is made from), the maximum projection, the in-focus
widefield image without noise (what no image of these planes beats without deconvolution), and
for each iteration count and ``deconvolution.method`` (lateral: each plane with the PSF's in-focus
plane; volume: the stack with the whole PSF) plexgpu's RL then the same EDF, beside scikit-image's
``richardson_lucy(clip=False)`` with the same kernel then the same EDF; for volume also plexgpu's RL
then a maximum projection. Time per voxel-iteration of each RL (one CPU thread for scikit-image,
the pipeline's FFT workers for plexgpu).
"""

import argparse

import numpy as np
from common import peak_rss_mb, pollen, timer, write_result
from scipy import ndimage
from skimage.restoration import richardson_lucy as skimage_rl

from plexgpu.image import deconvolution, edf, psf
from plexgpu.image.synth import SynthDataset, SynthSpec

BANDS = ((0.0, 0.25), (0.25, 0.5), (0.5, 1.0))     # fractions of Nyquist

ap = argparse.ArgumentParser()
ap.add_argument("--z", type=int, default=9)
ap.add_argument("--tile", type=int, default=256)
ap.add_argument("--thickness", default="0,3,6", help="specimen thickness(es) in µm; 0 is a thin sheet")
ap.add_argument("--iterations", default="5,10,25,50")
ap.add_argument("--no-skimage", action="store_true", help="leave scikit-image's RL out (fast)")
args = ap.parse_args()
iterations = [int(v) for v in args.iterations.split(",")]


def corr(a, b):
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


def band_errors(a, b):
    """Per BANDS: |s A - T|^2 / |T|^2 over the band's Fourier coefficients of the Hann-windowed, mean-free
    image A and truth T, s one least-squares scale over all bands (a blurred band is a band in error)."""
    win = np.outer(np.hanning(a.shape[0]), np.hanning(a.shape[1]))
    fa, fb = (np.fft.rfft2((v - v.mean()) * win) for v in (a, b))
    s = float(np.real(np.vdot(fa, fb)) / np.vdot(fa, fa).real)
    radius = np.hypot(np.fft.fftfreq(a.shape[0])[:, None], np.fft.rfftfreq(a.shape[1])[None, :]) / 0.5
    out = []
    for lo, hi in BANDS:
        m = (radius >= lo) & (radius < hi)
        out.append(float(np.sum(np.abs(s * fa[m] - fb[m]) ** 2) / np.sum(np.abs(fb[m]) ** 2)))
    return out


def cell_masks(ds, margin=24):
    """Labels of whole cells (nucleus + 2 px ring) fully in tissue and away from the border."""
    cells = ndimage.grey_dilation(ds.frame(1, ds.nucleus_labels), size=5)
    edge = np.ones(cells.shape, bool)
    edge[margin:-margin, margin:-margin] = False
    ids = np.setdiff1d(np.unique(cells), np.unique(cells[edge]))
    ids = ids[ids > 0]
    return cells, ids[ndimage.minimum(ds.frame(1, ds.tissue), cells, ids) > 0.95]


def judge(image, truth, cells, ids, inner):
    r = ndimage.sum_labels(image, cells, ids) / ndimage.sum_labels(truth, cells, ids)
    r /= np.median(r)
    e = band_errors(image[inner], truth[inner])
    return (f"r {corr(image[inner], truth[inner]):.4f}, band errors " + "/".join(f"{v:.3f}" for v in e)
            + f", cells {np.percentile(r, 5):.2f}-{np.percentile(r, 95):.2f}")


rows = []
cases = [(float(v), 0.75) for v in args.thickness.split(",")] + [(0.0, 0.6)]
for thickness, na in cases:
    ds = SynthDataset(SynthSpec(cycles=1, rows=2, cols=2, tile=(args.tile, args.tile), z_planes=args.z, channels=1,
                                seed=9, thickness_um=thickness, na=na))
    stack, amp = ds.stack(1, 1), ds.amplitude(1)
    rng = np.random.default_rng(0)
    data = np.clip(rng.poisson(stack * amp) + rng.normal(0, 3, stack.shape), 0, None).astype(np.float32)
    o = psf.Optics(**{**ds.optics(1).__dict__, "na": 0.75})      # the PSF the pipeline computes from its config
    kernels = {"volume": psf.psf(o, *psf.default_half_size(o, args.z))}
    kernels["lateral"] = psf.in_focus(kernels["volume"], o)
    inner = (slice(16, -16), slice(16, -16))
    truth = ds.specimen(1, 1)
    cells, ids = cell_masks(ds)
    what = ("thin sheet" if thickness == 0 else f"{thickness:g} µm slab") + (f", imaged at NA {na}" if na != 0.75 else "")
    t = {}
    with timer(t, "edf"):
        plain = edf.extended_depth_of_field(data).image
    rows.append({"what": f"{what}, {args.z}x{data.shape[1]}x{data.shape[2]}: no RL", "ours_s": t["edf"],
                 "peer": "maximum projection; in-focus image without noise", "peer_s": None, "ratio": None,
                 "ours_accuracy": "EDF " + judge(plain, truth, cells, ids, inner),
                 "peer_accuracy": "max " + judge(data.max(axis=0), truth, cells, ids, inner) + "; in focus "
                                  + judge(ds.in_focus(1, 1), truth, cells, ids, inner),
                 "peak_rss_mb": peak_rss_mb()})
    for method, it in [(m, i) for m in ("lateral", "volume") for i in iterations]:
        kernel = kernels[method]
        with timer(t, "ours"):
            ours = deconvolution.richardson_lucy(data, kernel, it)
        ours_edf = edf.extended_depth_of_field(ours).image
        peer, peer_s = "scikit-image RL skipped", None
        if not args.no_skimage:
            with timer(t, "skimage"):
                theirs = skimage_rl(data, kernel, num_iter=it, clip=False)
            peer = "skimage richardson_lucy(clip=False) then EDF: " + judge(
                edf.extended_depth_of_field(theirs).image, truth, cells, ids, inner)
            peer_s = t["skimage"]
            peer += f"; {peer_s / data.size / it * 1e9:.1f} ns per voxel-iteration"
        also = f"; then max {judge(ours.max(axis=0), truth, cells, ids, inner)}" if method == "volume" else ""
        rows.append({"what": f"{what}, {args.z}x{data.shape[1]}x{data.shape[2]}: {method} RL {it}",
                     "ours_s": t["ours"], "peer": "skimage richardson_lucy(clip=False)", "peer_s": peer_s,
                     "ratio": None if peer_s is None else peer_s / t["ours"],
                     "ours_accuracy": f"then EDF {judge(ours_edf, truth, cells, ids, inner)}{also}; "
                                      f"{t['ours'] / data.size / it * 1e9:.1f} ns per voxel-iteration",
                     "peer_accuracy": peer, "peak_rss_mb": peak_rss_mb()})
        print(rows[-1]["what"], "|", rows[-1]["ours_accuracy"], "|", peer, flush=True)
real = pollen()
if real is not None:    # a real 3-D specimen with its truth (sdeconv's pollen, a Gaussian PSF of 1 voxel)
    truth, data, volume = real
    kernels = {"lateral": volume[4:5] / volume[4:5].sum(), "volume": volume}
    ref = truth.max(axis=0)                       # a volume's sharp projection

    def both(stack):
        return (f"EDF r {corr(edf.extended_depth_of_field(stack).image, ref):.4f}, "
                f"max r {corr(stack.max(axis=0), ref):.4f}")
    for it in (10, 25):
        t = {}
        res = {}
        for method, kernel in kernels.items():
            with timer(t, method):
                res[method] = deconvolution.richardson_lucy(data, kernel, it)
        rows.append({"what": f"pollen (real, 3-D) {data.shape}: RL {it}, against the truth's max projection",
                     "ours_s": t["lateral"], "peer": "volume RL; no RL", "peer_s": t["volume"], "ratio": None,
                     "ours_accuracy": "lateral " + both(res["lateral"]),
                     "peer_accuracy": "volume " + both(res["volume"]) + "; no RL " + both(data),
                     "peak_rss_mb": peak_rss_mb()})
        print(rows[-1]["what"], "|", rows[-1]["ours_accuracy"], "|", rows[-1]["peer_accuracy"], flush=True)
write_result("decon_edf", rows, notes="judged against the sharp specimen; band errors at "
             + ", ".join(f"{lo:g}-{hi:g}" for lo, hi in BANDS) + " of Nyquist; ours_s: plexgpu RL alone")
