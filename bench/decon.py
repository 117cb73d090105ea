"""Richardson-Lucy: plexgpu vs skimage.restoration.richardson_lucy on the same stack and PSF,
both judged against the truth.

  python bench/decon.py [--z 20] [--size 1024] [--iterations 25]

Two PSFs: a shallow one (7 planes) and the one the pipeline uses (psf.default_half_size: as
deep as the stack, lateral half size capped at psf.MAX_HALF_XY). And real data: the pollen stack
of ../shared/realdata (32 x 256^2, blurred by a Gaussian PSF, 9^3 around its peak, plus noise),
against its truth (NRMSE). Times with the pipeline's threads (workers = 2 here) and with one;
scikit-image runs on one.
"""

import argparse

import numpy as np
from common import peak_rss_mb, pollen, timer, write_result
from scipy.signal import fftconvolve
from skimage.restoration import richardson_lucy

from plexgpu.image import deconvolution, psf

ap = argparse.ArgumentParser()
ap.add_argument("--z", type=int, default=20)
ap.add_argument("--size", type=int, default=1024)
ap.add_argument("--iterations", type=int, default=25)
args = ap.parse_args()
o = psf.Optics(0.377, 1.5, 0.75, 1.0, 1.33, 520)
rng = np.random.default_rng(0)
truth = np.full((args.z, args.size, args.size), 20, np.float32)
n = args.z * args.size * args.size // 2000
truth[rng.integers(0, args.z, n), rng.integers(0, args.size, n), rng.integers(0, args.size, n)] += rng.uniform(100, 1000, n)
rows, notes = [], []
for label, half in (("shallow PSF", (3, 12)), ("pipeline PSF", psf.default_half_size(o, args.z))):
    kernel = psf.psf(o, *half)
    img = np.clip(fftconvolve(truth, kernel, mode="same"), 0, None).astype(np.float32)
    t = {}
    with timer(t, "ours"):
        ours = deconvolution.richardson_lucy(img, kernel, args.iterations, workers=-1)
    with timer(t, "skimage"):
        ref = richardson_lucy(img, kernel, num_iter=args.iterations, clip=False)
    m = kernel.shape[1]
    inner = (slice(args.z // 4, -args.z // 4 or None), slice(m, -m), slice(m, -m))

    def vs_truth(est):
        """Relative RMS error against the truth in the interior."""
        return float(np.sqrt(np.mean((est[inner] - truth[inner]) ** 2)) / np.sqrt(np.mean(truth[inner] ** 2)))

    rows.append({"what": f"RL {args.z}x{args.size}^2, {args.iterations} iterations, {label} {kernel.shape}",
                 "ours_s": t["ours"], "peer": "skimage richardson_lucy(clip=False)", "peer_s": t["skimage"],
                 "ratio": t["skimage"] / t["ours"],
                 "ours_accuracy": f"rel. RMS error vs truth {vs_truth(ours):.4f} (input {vs_truth(img):.4f})",
                 "peer_accuracy": f"rel. RMS error vs truth {vs_truth(ref):.4f}", "peak_rss_mb": peak_rss_mb()})
    diff = float(np.abs(ours[inner] - ref[inner]).max() / np.abs(ref[inner]).max())
    notes.append(f"{label}: max difference ours vs skimage in the interior {diff:.1e} of the peak")
    del ours, ref, img
real = pollen()
if real is not None:
    truth, img, kernel = real
    def nrmse(e):
        return float(np.sqrt(np.mean((e - truth) ** 2)) / np.sqrt(np.mean(truth ** 2)))
    t = {}
    with timer(t, "ours"):
        ours = deconvolution.richardson_lucy(img, kernel, args.iterations, workers=-1)
    with timer(t, "ours1"):
        deconvolution.richardson_lucy(img, kernel, args.iterations, workers=1)
    with timer(t, "skimage"):
        ref = richardson_lucy(img, kernel, num_iter=args.iterations, clip=False)
    rows.append({"what": f"RL pollen (real) {img.shape}, {args.iterations} iterations, PSF {kernel.shape}",
                 "ours_s": t["ours"], "peer": "skimage richardson_lucy(clip=False)", "peer_s": t["skimage"],
                 "ratio": t["skimage"] / t["ours"],
                 "ours_accuracy": f"NRMSE vs truth {nrmse(ours):.4f} (blurred {nrmse(img):.4f}); one thread "
                                  f"{t['ours1']:.2f} s (ratio {t['skimage'] / t['ours1']:.2f})",
                 "peer_accuracy": f"NRMSE vs truth {nrmse(ref):.4f}", "peak_rss_mb": peak_rss_mb()})
write_result("decon", rows, notes="; ".join(notes) + " (skimage pads with zeros, plexgpu mirrors; over the "
                                                      "iterations the border difference reaches inward)")
