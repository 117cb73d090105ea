"""Registration across the mosaic, block by block, on real texture: the wsi_brain tiles
(../shared/realdata) laid at Fiji's positions into one ~3300 x 4200 px mosaic (real tissue, real
bare slide), and cycles made from it as a re-seated slide comes back: a sub-pixel stage error, a
rotation, a smooth tissue deformation, independent noise, optionally a bleached region.

Measured as the user measures: after registration, the residual shift of every 128 px block of the
registered image against the reference (phase correlation, reliable blocks only): worst, median and
the fraction within 0.5 px; side by side with scikit-image (phase_cross_correlation for the
translation, then optical_flow_ilk, radius 24, applied by warp) on the same images, with times.

  python bench/registration_mosaic.py [--crop 1536] [--regimes translation,rot0.35,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy import ndimage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from common import wsi_brain_fiji  # noqa: E402
from plexgpu.image import registration  # noqa: E402
from plexgpu.io.tiff import read_tiff  # noqa: E402

REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata" / "wsi_brain"
BLOCK = 128
REGIMES = {     # rotation (deg), stage error (px), deformation amplitude (px), bleached region
    "translation": (0.0, (3.3, -5.7), 0.0, False),
    "rot0.15": (0.15, (2.4, 1.1), 0.0, False),
    "rot0.35": (0.35, (-4.2, 2.6), 0.0, False),
    "rot0.5+deform2.5": (0.5, (1.7, -3.1), 2.5, False),
    "rot0.25+deform4": (0.25, (-2.2, 4.4), 4.0, False),
    "rot0.3+deform2+bleached": (0.3, (2.9, 0.6), 2.0, True),
}


def real_mosaic() -> np.ndarray:
    pos = wsi_brain_fiji()
    y0 = min(p[0] for p in pos.values())
    x0 = min(p[1] for p in pos.values())
    h = int(max(p[0] for p in pos.values()) - y0) + 512
    w = int(max(p[1] for p in pos.values()) - x0) + 512
    out = np.zeros((h, w), np.float32)
    for t, (y, x) in sorted(pos.items()):
        yy, xx = int(round(y - y0)), int(round(x - x0))
        out[yy:yy + 512, xx:xx + 512] = read_tiff(REALDATA / "tiles" / f"C3-BrainSection{t:04d}.tif")
    return out


def displacement(shape, rotation_deg, stage, deform, seed):
    """d'(q): moving(q) = reference(q - d'(q)); a rotation about the centre, a shift, a smooth warp."""
    h, w = shape
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    t = np.radians(rotation_deg)
    cy, cx = (h - 1) / 2, (w - 1) / 2
    dy = stage[0] + (np.cos(t) - 1) * (y - cy) - np.sin(t) * (x - cx)
    dx = stage[1] + np.sin(t) * (y - cy) + (np.cos(t) - 1) * (x - cx)
    if deform:
        rng = np.random.default_rng(seed)
        for d in (dy, dx):
            ph = rng.uniform(0, 2 * np.pi, 2)
            d += deform * np.sin(2 * np.pi * y / (0.9 * h) + ph[0]) * np.cos(2 * np.pi * x / (1.1 * w) + ph[1])
    return dy, dx


def make_cycle(ref, regime, seed):
    rot, stage, deform, bleached = REGIMES[regime]
    dy, dx = displacement(ref.shape, rot, stage, deform, seed)
    y, x = np.mgrid[0:ref.shape[0], 0:ref.shape[1]].astype(np.float64)
    moving = ndimage.map_coordinates(ref, [y - dy, x - dx], order=3, mode="nearest").astype(np.float32)
    if bleached:
        h, w = moving.shape
        moving[h // 4:h // 2, w // 3:w // 2] = float(np.percentile(moving, 5))
    rng = np.random.default_rng(seed + 100)
    noisy = lambda a: np.maximum(a + rng.normal(0, 0.01 * float(a.std()), a.shape), 0).astype(np.float32)  # noqa: E731
    return noisy(moving)


def residuals(ref, reg):
    r, ok = registration.local_residuals(ref, reg, BLOCK)
    v = r[ok]
    return {"worst_px": float(v.max()) if v.size else float("nan"), "median_px": float(np.median(v)) if v.size else None,
            "within_0.5px": float((v <= 0.5).mean()) if v.size else None, "blocks": int(v.size)}, ok


def ours(ref, mov, model):
    t0 = time.perf_counter()
    tr = registration.register_cycle(ref, mov, "cyc002", model=model, block_px=BLOCK)
    reg = registration.apply_transform(mov, tr, ref.shape)
    return reg, time.perf_counter() - t0, tr


def block_centres(shape) -> tuple[np.ndarray, np.ndarray]:
    """(y, x) of the held-out blocks local_residuals measures, on its grid."""
    return np.meshgrid(*registration.block_grid(shape, BLOCK, between=True), indexing="ij")


def true_errors(shape, regime, seed, d_at):
    """|d(p) - d'(p + d(p))| at every block centre of local_residuals' grid: the registration's true error
    there (``d_at(y, x)``: the registration's displacement; d' the one the cycle was made with)."""
    rot, stage, deform, _ = REGIMES[regime]
    ty, tx = displacement(shape, rot, stage, deform, seed)
    y, x = block_centres(shape)
    dy, dx = d_at(y, x)
    at = [y + dy, x + dx]
    return np.hypot(dy - ndimage.map_coordinates(ty, at, order=1, mode="nearest"),
                    dx - ndimage.map_coordinates(tx, at, order=1, mode="nearest"))


def transform_at(tr):
    def d_at(y, x):
        ry, rx = tr.rigid(y, x)
        ly, lx = tr.local(y, x)
        return ry + ly, rx + lx
    return d_at


def truth_summary(err, ok) -> dict:
    """The true error over the blocks the user can measure (``ok``: textured, reliable) and over all."""
    v = err[ok]
    return {"true_worst_px": round(float(v.max()), 3) if v.size else None,
            "true_within_0.5px": round(float((v <= 0.5).mean()), 3) if v.size else None,
            "true_worst_all_px": round(float(err.max()), 3)}


def skimage_flow(ref, mov):
    from skimage.registration import optical_flow_ilk, phase_cross_correlation
    from skimage.transform import warp

    t0 = time.perf_counter()
    shift, _, _ = phase_cross_correlation(ref, mov, upsample_factor=20)
    moved = ndimage.shift(mov, shift, order=3)
    v, u = optical_flow_ilk(ref, moved, radius=24)
    y, x = np.mgrid[0:ref.shape[0], 0:ref.shape[1]]
    reg = warp(moved, np.array([y + v, x + u]), mode="edge", preserve_range=True).astype(np.float32)
    seconds = time.perf_counter() - t0

    def d_at(py, px):           # reg(p) = moved(p + flow(p)) = mov(p + flow(p) - shift)
        at = [py, px]
        return (ndimage.map_coordinates(v, at, order=1, mode="nearest") - shift[0],
                ndimage.map_coordinates(u, at, order=1, mode="nearest") - shift[1])
    return reg, seconds, d_at


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--crop", type=int, default=0, help="use the mosaic's central crop of this size (0: all)")
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    ref = real_mosaic()
    if args.crop:
        h, w = ref.shape
        c = args.crop
        ref = ref[(h - c) // 2:(h + c) // 2, (w - c) // 2:(w + c) // 2].copy()
    rows = []
    for i, regime in enumerate(args.regimes.split(",")):
        mov = make_cycle(ref, regime, i)
        row = {"regime": regime, "shape": list(ref.shape)}
        for model in ("translation", "rigid", "local"):
            try:
                reg, secs, tr = ours(ref, mov, model)
            except registration.RegistrationError as exc:
                row[model] = {"refused": str(exc)[:120]}
                continue
            measured, ok = residuals(ref, reg)
            row[model] = {**measured, **truth_summary(true_errors(ref.shape, regime, i, transform_at(tr)), ok),
                          "s": round(secs, 2), "rotation_deg": round(tr.rotation_deg, 4)}
        if not args.no_peers:
            reg, secs, d_at = skimage_flow(ref, mov)
            measured, ok = residuals(ref, reg)
            row["skimage_pcc+ilk"] = {**measured, **truth_summary(true_errors(ref.shape, regime, i, d_at), ok),
                                      "s": round(secs, 2)}
        rows.append(row)
        print(regime, {k: (v if not isinstance(v, dict) else {kk: (round(vv, 3) if isinstance(vv, float) else vv)
                                                           for kk, vv in v.items()}) for k, v in row.items()
                       if k not in ("regime", "shape")}, flush=True)
    try:
        from common import write_result
        write_result("registration_mosaic", rows, notes="real wsi_brain mosaic (Fiji positions), cycles warped by a "
                     "known rotation + stage error + smooth deformation + noise; residual = block shift after "
                     f"registration ({BLOCK} px blocks, reliable ones); true_*: |d(p) - d'(p + d(p))| at the same block "
                     "centres against the displacement the cycle was made with (true_worst_all_px: every block)")
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
