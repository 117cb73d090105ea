"""The flatfield and offset a cycle gets without overlaps (BaSiC alone: the stitch stage's fallback when
its pairs are rejected), beside basicpy 2.0.0, with known truth and by the half-split test.

  python bench/basic_alone.py [--basicpy bench/.venv-basicpy/bin/python] [--quick]

Stacks are made here, not by plexgpu.image.synth: fields drawn at random places of a large
specimen (no overlaps used), a flatfield that is not the pipeline's own shape (off-centre
vignetting with a tilt), a camera offset of 100 counts with a 10-count ramp, Poisson light and
read noise. Regimes: dense nuclei everywhere (no bare slide), a sparse marker on dim
autofluorescence, a dim marker at low counts, and one field drifting (a time lapse: every image
shows the same cells). Each stack is split in two halves: the profiles are fitted on one and
judged on the other.

Per method: the flatfield's RMS error against the truth (mean 1), the offset's bias (counts),
the held-out corrected images against the true light (per-image intercept in counts, and the
slope's spread), and the CV of the held-out corrected mean image (the test of the issue; it is
also given for the real wsi_brain tiles, which have no truth) with its standard deviation in
counts (the CV favours the lower of two darkfields: its pedestal raises the mean; the deviation
does not). On wsi_brain also how far apart the two corrected readings of each of its 87 overlaps
are, at Fiji's positions: their median |log ratio|, which favours the lower of two darkfields
too (one lower by c times the flatfield leaves a pedestal c in every pixel, and that pulls every
ratio toward 1), and their median |difference| in counts, which does not; for each, ours less
basicpy's at the same setting, paired over the overlaps, with a 95 % interval from resampling them.
"""

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from common import overlap_differences, overlap_log_ratios, write_result, wsi_brain_fiji
from scipy import ndimage

from plexgpu.image import basic, shading

HERE = Path(__file__).parent
REAL = HERE.parent.parent / "shared" / "realdata" / "wsi_brain" / "tiles"
TILE, WS = 256, 128


def true_flat(shape, rng):
    y, x = np.mgrid[0:shape[0], 0:shape[1]] / np.array(shape).reshape(2, 1, 1)
    cy, cx = 0.5 + rng.uniform(-0.12, 0.12, 2)
    r2 = ((y - cy) ** 2 + (x - cx) ** 2) / 0.5
    f = (1 - 0.45 * r2) * (1 + 0.08 * (x - 0.5))
    return (f / f.mean()).astype(np.float32)


def offset_image(shape):
    y, x = np.mgrid[0:shape[0], 0:shape[1]] / np.array(shape).reshape(2, 1, 1)
    return (100 + 10 * (0.6 * x + 0.4 * y)).astype(np.float32)


def world(kind: str, rng, size=1600):
    """Specimen light (counts per pixel at flatfield 1) of a regime."""
    def cells(n, radius, level):
        img = np.zeros((size, size), np.float32)
        ys, xs = rng.integers(0, size, n), rng.integers(0, size, n)
        img[ys, xs] = rng.lognormal(0, 0.4, n) * level
        return ndimage.gaussian_filter(img, radius) * (2 * np.pi * radius ** 2)
    smooth = ndimage.gaussian_filter(rng.normal(0, 1, (size, size)), 60).astype(np.float32)
    smooth = 1 + 0.5 * smooth / smooth.std()          # tissue density varies across the slide
    if kind == "dense":
        return np.clip(40 + cells(22000, 4.0, 400) * np.clip(smooth, 0.3, None), 0, None)
    if kind == "sparse":
        return 30 * np.clip(smooth, 0.4, None) + cells(900, 4.0, 1500)
    if kind == "dim":
        return 6 * np.clip(smooth, 0.4, None) + cells(2500, 4.0, 60)
    if kind == "timelapse":
        return 40 + cells(3000, 5.0, 500)
    raise ValueError(kind)


def make_stack(kind: str, n: int, seed: int):
    rng = np.random.default_rng(seed)
    w = world(kind, rng)
    flat, off = true_flat((TILE, TILE), rng), offset_image((TILE, TILE))
    light, raw = [], []
    for i in range(n):
        if kind == "timelapse":                        # the same field, drifting a few pixels, cells blinking
            y0, x0 = 600 + int(3 * np.sin(i / 5)), 600 + i // 4
            s = w[y0:y0 + TILE, x0:x0 + TILE] * rng.uniform(0.9, 1.1)
        else:
            y0, x0 = rng.integers(0, w.shape[0] - TILE, 2)
            s = w[y0:y0 + TILE, x0:x0 + TILE]
        light.append(s)
        raw.append(rng.poisson(s * flat) + off + rng.normal(0, 2.0, s.shape))
    return np.stack(raw).astype(np.float32), np.stack(light).astype(np.float32), flat, off


def ours(raw: np.ndarray, darkfield: bool):
    """The stitch stage's profiles for one plane when no pair is accepted (stages/_stitch: BaSiC, then the
    channel's offset under the low envelope, then the flatfield refined on no overlaps)."""
    params = basic.BasicParams(darkfield=darkfield, working_size=WS)
    small = basic.downsample(raw, WS)[None]
    fit = basic.fit_anchored(small, [0], params)
    tiles = small[0].astype(np.float64)
    scale = (WS / raw.shape[1], WS / raw.shape[2])
    sh = shading.shade_plane(tiles, fit.flatfield[0], fit.darkfield[0].astype(np.float64) if darkfield else None,
                             [], scale)
    return basic.upsample(sh.flatfield, raw.shape[1:]), basic.upsample(sh.darkfield, raw.shape[1:])


def basicpy(halves: list[np.ndarray], darkfield: bool, python: str):
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(f"{tmp}/in.npz", **{f"p{i:02d}": h for i, h in enumerate(halves)})
        settings = {"get_darkfield": darkfield, "sort_intensity": True, "fitting_mode": "approximate"}
        subprocess.run([python, str(HERE / "basicpy_peer.py"), f"{tmp}/in.npz", f"{tmp}/out.npz",
                        json.dumps(settings)], check=True, capture_output=True)
        out = np.load(f"{tmp}/out.npz")
        return list(zip(out["flat"], out["dark"]))


def held_out(raw, light, flat, dark, true_flat_, true_off):
    """Judge profiles on held-out images: flat error, offset bias, per-image intercept vs truth, the corrected mean
    image's CV and its standard deviation (counts: the CV favours the lower of two darkfields, whose pedestal
    raises the mean; the deviation does not)."""
    f = flat / flat.mean()
    corr = (raw - dark) / f
    inter, slope = [], []
    for c, s in zip(corr, light):
        a = np.polyfit(s.ravel(), c.ravel(), 1)
        slope.append(a[0])
        inter.append(a[1])
    m = corr.mean(0)
    return {"flat_rms_pct": round(100 * float(np.sqrt(np.mean((f - true_flat_) ** 2))), 2),
            "offset_bias": round(float((dark - true_off).mean()), 1),
            "intercept_abs_max": round(float(np.max(np.abs(inter))), 1),
            "slope_spread_pct": round(100 * float(np.std(slope) / np.mean(slope)), 2),
            "cv_mean_image": round(float(m.std() / m.mean()), 4),
            "std_mean_image": round(float(m.std()), 2)}


def fiji_overlaps(shape, smallest: int = 30) -> list[tuple[int, int, int, int]]:
    """The wsi_brain tiles' overlaps at Fiji's positions (tile 45 out): (a, b, dy, dx) of b from a, 0-based
    tile indices, each a strip of at least ``smallest`` px across and longer than half a tile (no corners)."""
    fiji = {t: np.array(p) for t, p in wsi_brain_fiji().items() if t != 45}
    out = []
    for a in sorted(fiji):
        for b in sorted(fiji):
            dy, dx = (int(v) for v in np.round(fiji[b] - fiji[a]))
            h, w = shape[0] - abs(dy), shape[1] - abs(dx)
            if a < b and min(h, w) >= smallest and max(h, w) > shape[0] // 2 and min(h, w) < shape[0] // 2:
                out.append((a - 1, b - 1, dy, dx))
    return out


def paired_difference(ours: np.ndarray, peer: np.ndarray, scale: float = 100.0, draws: int = 2000) -> dict:
    """Ours less the peer's median over the same overlaps (times ``scale``: 100 for fractions in %, 1 for counts),
    with a 95 % interval from resampling the overlaps (paired: an overlap drawn is drawn for both), and how many
    overlaps ours reads closer."""
    rng = np.random.default_rng(0)
    k = rng.integers(0, len(ours), (draws, len(ours)))
    d = scale * (np.median(ours[k], axis=1) - np.median(peer[k], axis=1))
    return {"minus_peer": round(scale * float(np.median(ours) - np.median(peer)), 2),
            "minus_peer_ci95": [round(float(v), 2) for v in np.percentile(d, [2.5, 97.5])],
            "closer_than_peer": f"{int((ours < peer).sum())}/{len(ours)}"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--basicpy", default=str(HERE / ".venv-basicpy/bin/python"))
    ap.add_argument("--quick", action="store_true", help="two regimes, no basicpy")
    args = ap.parse_args()
    have_peer = Path(args.basicpy).exists() and not args.quick
    rows = []
    kinds = ("dense", "sparse") if args.quick else ("dense", "sparse", "dim", "timelapse")
    for seed, kind in enumerate(kinds):
        raw, light, tf, to = make_stack(kind, 80, seed)
        fit_h, test_h = slice(0, None, 2), slice(1, None, 2)
        methods = {"none": (np.ones_like(tf), np.zeros_like(to))}
        methods["ours darkfield"] = ours(raw[fit_h], True)
        methods["ours no darkfield"] = ours(raw[fit_h], False)
        if have_peer:
            methods["basicpy darkfield"] = basicpy([raw[fit_h]], True, args.basicpy)[0]
            methods["basicpy no darkfield"] = basicpy([raw[fit_h]], False, args.basicpy)[0]
        for name, (f, d) in methods.items():
            rows.append({"regime": kind, "method": name,
                         **held_out(raw[test_h], light[test_h], f, d, tf, to)})
            print(rows[-1], flush=True)
    if REAL.exists():
        from plexgpu.io.tiff import read_tiff
        tiles = np.stack([read_tiff(p).astype(np.float32) for p in sorted(REAL.glob("*.tif"))])
        pairs = fiji_overlaps(tiles.shape[1:])
        for name, part in (("all", slice(None)), ("odd", slice(0, None, 2)), ("even", slice(1, None, 2))):
            fit, test = tiles[part], tiles[slice(1 if name == "odd" else 0, None, 2)]
            methods = {"none": (np.ones(tiles.shape[1:], np.float32), np.zeros(tiles.shape[1:], np.float32)),
                       "ours darkfield": ours(fit, True), "ours no darkfield": ours(fit, False)}
            if have_peer:
                methods["basicpy darkfield"] = basicpy([fit], True, args.basicpy)[0]
                methods["basicpy no darkfield"] = basicpy([fit], False, args.basicpy)[0]
            ratios = {m: overlap_log_ratios(tiles, pairs, f, d) for m, (f, d) in methods.items()}
            apart = {m: overlap_differences(tiles, pairs, f, d) for m, (f, d) in methods.items()}
            for m, (f, d) in methods.items():
                mean = ((test - d) / (f / f.mean())).mean(0)
                rows.append({"regime": f"wsi_brain fit {name}", "method": m,
                             "cv_mean_image": None if name == "all" else round(float(mean.std() / mean.mean()), 4),
                             "std_mean_image": None if name == "all" else round(float(mean.std()), 1),
                             "overlap_log_ratio_pct": round(100 * float(np.median(ratios[m])), 2),
                             "overlap_difference_counts": round(float(np.median(apart[m])), 1),
                             "offset_mean": round(float(d.mean()), 1)})
                peer = m.replace("ours", "basicpy")
                if m.startswith("ours") and peer in ratios:
                    rows[-1]["vs_basicpy_log_ratio_pct"] = paired_difference(ratios[m], ratios[peer])
                    rows[-1]["vs_basicpy_difference_counts"] = paired_difference(apart[m], apart[peer], 1.0)
                print(rows[-1], flush=True)
    if not args.quick:
        write_result("basic_alone", rows, notes=__doc__.strip().splitlines()[0])


if __name__ == "__main__":
    main()
