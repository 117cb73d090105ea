"""How many Richardson-Lucy iterations before EDF? The EDF image's correlation with the specimen's
in-focus truth after 0, 10, 25 and 50 iterations, on a thin section and on thick slabs, with the
noise the pipeline's data have (Poisson + read noise, clipped at 0 as the uint16 mosaic is), and
on a thin section whose blur is not the pipeline's PSF (imaged at NA 0.6, deconvolved with the
NA 0.75 PSF the config describes). Beside them: the maximum projection, and the plane nearest
each pixel's true depth (what no EDF of the recorded planes can beat).

  python bench/decon_edf.py [--z 9] [--tile 256] [--thickness 0,3,6]

Also reported: the correlation of fine detail (< 1.5 px), where a deconvolution should help if
anywhere, and what a user measures: each cell's integrated intensity (nucleus + 2 px ring, in
tissue, away from the border) in the EDF image over the same in the truth, normalised by the
median cell, 5th-95th percentile over the cells; 1.00-1.00 is quantitative. Informs the default of
`deconvolution.iterations`.
"""

import argparse

import numpy as np
from common import peak_rss_mb, timer, write_result
from scipy import ndimage

from plexgpu.image import deconvolution, edf, psf
from plexgpu.image.synth import SynthDataset, SynthSpec

ap = argparse.ArgumentParser()
ap.add_argument("--z", type=int, default=9)
ap.add_argument("--tile", type=int, default=256)
ap.add_argument("--thickness", default="0,3,6", help="specimen thickness(es) in µm; 0 is a thin sheet")
ap.add_argument("--iterations", default="0,10,25,50")
args = ap.parse_args()
iterations = [int(v) for v in args.iterations.split(",")]
def corr(a, b):
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])
def fine(a):
    return a - ndimage.gaussian_filter(a, 1.5)


def cell_masks(ds, margin=24):
    """Labels of whole cells (nucleus + 2 px ring) fully in tissue and away from the border."""
    cells = ndimage.grey_dilation(ds.frame(1, ds.nucleus_labels), size=5)
    edge = np.ones(cells.shape, bool)
    edge[margin:-margin, margin:-margin] = False
    ids = np.setdiff1d(np.unique(cells), np.unique(cells[edge]))
    ids = ids[ids > 0]
    return cells, ids[ndimage.minimum(ds.frame(1, ds.tissue), cells, ids) > 0.95]


def cell_spread(image, truth, cells, ids):
    r = ndimage.sum_labels(image, cells, ids) / ndimage.sum_labels(truth, cells, ids)
    r /= np.median(r)
    return f"{np.percentile(r, 5):.2f}-{np.percentile(r, 95):.2f}"


rows = []
cases = [(float(v), 0.75) for v in args.thickness.split(",")] + [(0.0, 0.6)]
for thickness, na in cases:
    ds = SynthDataset(SynthSpec(cycles=1, rows=2, cols=2, tile=(args.tile, args.tile), z_planes=args.z, channels=1,
                                seed=9, thickness_um=thickness, na=na))
    stack, amp = ds.stack(1, 1), ds.amplitude(1)
    rng = np.random.default_rng(0)
    data = np.clip(rng.poisson(stack * amp) + rng.normal(0, 3, stack.shape), 0, None).astype(np.float32)
    o = psf.Optics(**{**ds.optics(1).__dict__, "na": 0.75})      # the PSF the pipeline computes from its config
    kernel = psf.psf(o, *psf.default_half_size(o, args.z))
    inner = (slice(16, -16), slice(16, -16))
    full_truth = ds.in_focus(1, 1)
    truth = full_truth[inner]
    cells, ids = cell_masks(ds)
    whole, detail, per_cell, t = [], [], [], {}
    for it in iterations:
        with timer(t, it):
            full = edf.extended_depth_of_field(deconvolution.richardson_lucy(data, kernel, it)).image
        image = full[inner]
        whole.append(f"RL{it} {corr(image, truth):.4f}")
        detail.append(f"RL{it} {corr(fine(image), fine(truth)):.3f}")
        per_cell.append(f"RL{it} {cell_spread(full, full_truth, cells, ids)}")
    what = ("thin sheet" if thickness == 0 else f"{thickness:g} µm slab") + (f", imaged at NA {na}" if na != 0.75 else "")
    nearest = np.take_along_axis(data, np.clip(np.rint(ds.depth_map(1)), 0, args.z - 1).astype(int)[None], 0)[0]
    rows.append({"what": f"RL then EDF, {what}, {args.z}x{data.shape[1]}x{data.shape[2]}", "ours_s": t[iterations[-1]],
                 "peer": "EDF without RL", "peer_s": t[iterations[0]], "ratio": None,
                 "ours_accuracy": "corr with in-focus truth: " + ", ".join(whole) + "; fine detail: " + ", ".join(detail)
                 + f"; per-cell intensity / truth p5-p95 ({len(ids)} cells): " + ", ".join(per_cell),
                 "peer_accuracy": f"maximum projection {corr(data.max(axis=0)[inner], truth):.4f} (per cell "
                                  f"{cell_spread(data.max(axis=0), full_truth, cells, ids)}); plane at the true depth "
                                  f"{corr(nearest[inner], truth):.4f} "
                                  f"(per cell {cell_spread(nearest, full_truth, cells, ids)})",
                 "peak_rss_mb": peak_rss_mb()})
write_result("decon_edf", rows, notes="ours_s: time of RL (last count) + EDF; peer_s: EDF alone")
