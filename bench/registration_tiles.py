"""Cross-cycle alignment from tiles, as cycles come off the microscope, side by side with ASHLAR 1.20.

The world is the real wsi_brain mosaic (../shared/realdata, Fiji's positions, ~2900 x 4400 px). Cycle 1
is a 5 x 8 grid of 512 px tiles (10 % overlap) cut from it at the nominal stage positions plus a stage
jitter of its own; every later cycle is cut the same way from the world moved as a re-seated slide
comes back (a rotation about the slide's centre, a stage error, a smooth tissue deformation), with a
stage jitter of its own, and in one regime with its whole grid offset by a fraction of a tile (the
mosaics then cover different areas). Every tile gets noise of its own.

- ours: each cycle stitched (plexgpu.image.stitching), then the cycle's mosaic registered onto cycle 1's
  (plexgpu.image.registration, model local, and translation for comparison);
- ASHLAR 1.20 (make bench-env): EdgeAligner on cycle 1, LayerAligner on cycle 2 (its cycle alignment: a
  translation per tile against the reference mosaic), both assembled in cycle 1's frame; run at its
  whitening filter 0 (default) and 1 (its best in bench/stitch_sweep).

Measured as the user measures: the residual shift of every 128 px block of the aligned cycle 2 against
cycle 1 (held-out blocks between the registration's own, reliable ones, wholly covered by both):
worst, median, fraction within 0.5 px; and the seconds of the cycle alignment.

  python bench/registration_tiles.py [--regimes stage,rot0.2,...] [--no-peers]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import ndimage

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "workflow"))
sys.path.insert(0, str(HERE))

import registration_mosaic as world_cycles  # noqa: E402
from plexgpu.image import registration, stitching  # noqa: E402

VENV_ASHLAR = HERE / ".venv-ashlar/bin/python"
ROWS, COLS, TILE, OVERLAP = 5, 8, 512, 0.1
JITTER_PX = 2.0
BLOCK = world_cycles.BLOCK      # the residual blocks: the same grid as registration_mosaic.block_centres
REGIMES = {     # rotation (deg), stage error (px), deformation (px), grid offset (px, cycle 2's grid against 1's)
    "stage error": (0.0, (3.3, -5.7), 0.0, (0.0, 0.0)),
    "rot0.2": (0.2, (-2.4, 4.1), 0.0, (0.0, 0.0)),
    "rot0.35+deform2": (0.35, (1.7, -3.1), 2.0, (0.0, 0.0)),
    "rot0.15+deform1.5+grid offset 0.3 tile": (0.15, (2.2, 1.4), 1.5, (0.3 * TILE, -0.45 * TILE)),
}


def cut_tiles(img, origin, rng) -> tuple[np.ndarray, list[tuple[int, int]], np.ndarray]:
    """The grid's tiles in raster order, each at the nominal position + origin + its own stage jitter
    (sub-pixel, cubic), with noise of its own; and their true top-left corners in ``img``."""
    step = stitching.nominal_step((TILE, TILE), OVERLAP)
    tiles, layout, where = [], [], []
    scale = float(img.std())
    for r in range(ROWS):
        for c in range(COLS):
            y = origin[0] + r * step[0] + np.clip(rng.normal(0, JITTER_PX), -2 * JITTER_PX, 2 * JITTER_PX)
            x = origin[1] + c * step[1] + np.clip(rng.normal(0, JITTER_PX), -2 * JITTER_PX, 2 * JITTER_PX)
            yy, xx = np.mgrid[0:TILE, 0:TILE].astype(np.float64)
            t = ndimage.map_coordinates(img, [yy + y, xx + x], order=3, mode="nearest")
            tiles.append(np.maximum(t + rng.normal(0, 0.01 * scale, t.shape), 0).astype(np.float32))
            layout.append((r, c))
            where.append((y, x))
    return np.stack(tiles), layout, np.array(where)


def make_cycles(world, regime, seed):
    rot, stage, deform, grid_offset = REGIMES[regime]
    rng = np.random.default_rng(seed)
    step = stitching.nominal_step((TILE, TILE), OVERLAP)
    span = ((ROWS - 1) * step[0] + TILE, (COLS - 1) * step[1] + TILE)
    origin = ((world.shape[0] - span[0]) / 2, (world.shape[1] - span[1]) / 2)
    tiles1, layout, true1 = cut_tiles(world, origin, rng)
    dy, dx = world_cycles.displacement(world.shape, rot, stage, deform, seed)
    y, x = np.mgrid[0:world.shape[0], 0:world.shape[1]].astype(np.float64)
    moved = ndimage.map_coordinates(world, [y - dy, x - dx], order=3, mode="nearest").astype(np.float32)
    del y, x
    tiles2, _, true2 = cut_tiles(moved, (origin[0] + grid_offset[0], origin[1] + grid_offset[1]), rng)
    return tiles1, tiles2, layout, Truth(true1, true2, dy, dx)


@dataclass
class Truth:
    """Where the tiles were cut (world / moved-world top-left corners) and the displacement d' of the
    moved world: moved(u) = world(u - d'(u))."""
    tiles1: np.ndarray
    tiles2: np.ndarray
    dy: np.ndarray
    dx: np.ndarray

    def error(self, points, placed1, placed2, read_at) -> np.ndarray:
        """The true misalignment at ``points`` of the reference mosaic (N, 2): the world point the
        reference shows there against the one the aligned cycle 2 shows there. ``placed1``/``placed2``:
        each cycle's tile corners in its mosaic; ``read_at``: where in cycle 2's mosaic the aligned image
        reads the point (ours: p + d(p); an assembly in cycle 1's frame: the point itself)."""
        w1 = _to_source(points, placed1, self.tiles1)
        u = _to_source(read_at, placed2, self.tiles2)
        w2 = u - np.stack([ndimage.map_coordinates(d, u.T, order=1, mode="nearest") for d in (self.dy, self.dx)], 1)
        return np.hypot(*(w2 - w1).T)


def _to_source(points, placed, true):
    """Mosaic points (N, 2) to the image the tiles were cut from, through the tile whose centre is nearest."""
    centres = np.asarray(placed, float) + TILE / 2
    k = np.abs(points[:, None, :] - centres[None]).max(axis=2).argmin(axis=1)
    return points + (true[k] - np.asarray(placed, float)[k])


def _block_centres(shape) -> np.ndarray:
    """The held-out blocks' centres as (N, 2) points."""
    return np.stack([c.ravel() for c in world_cycles.block_centres(shape)], 1)


def true_summary(err, ok) -> dict:
    """registration_mosaic.truth_summary of the errors at ``_block_centres`` (on the grid of ``ok``)."""
    return world_cycles.truth_summary(err.reshape(ok.shape), ok)


def residuals(ref, aligned, covered) -> tuple[dict, np.ndarray]:
    r, ok = registration.local_residuals(ref, aligned, BLOCK, covered)
    v = r[ok]
    return {"worst_px": round(float(v.max()), 3) if v.size else None,
            "median_px": round(float(np.median(v)), 3) if v.size else None,
            "within_0.5px": round(float((v <= 0.5).mean()), 3) if v.size else None, "blocks": int(v.size)}, ok


def ours(tiles1, tiles2, layout, model, truth, block_px=BLOCK):
    mosaics, placed = [], []
    for tiles in (tiles1, tiles2):
        m = stitching.compute_model(tiles, layout, OVERLAP)
        mosaics.append(stitching.blend(tiles, m))
        placed.append(m.positions)
    ref, mov = mosaics
    t0 = time.perf_counter()
    tr = registration.register_cycle(ref, mov, "cyc002", model=model, block_px=block_px)
    out = registration.apply_transform(mov, tr, ref.shape)
    seconds = time.perf_counter() - t0
    covered = registration.coverage(mov.shape, tr, ref.shape) & (ref > 0)
    measured, ok = residuals(ref, out, covered)
    p = _block_centres(ref.shape)
    ry, rx = tr.rigid(p[:, 0], p[:, 1])
    ly, lx = tr.local(p[:, 0], p[:, 1])
    err = truth.error(p, placed[0], placed[1], p + np.stack([ry + ly, rx + lx], 1))
    return {**measured, **true_summary(err, ok), "s": round(seconds, 2), "rotation_deg": round(tr.rotation_deg, 3)}


def ashlar(tiles1, tiles2, filter_sigma, truth):
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(f"{tmp}/in.npz", tiles1=tiles1, tiles2=tiles2, rows=ROWS, cols=COLS, overlap=OVERLAP,
                 max_shift=30.0, filter_sigma=filter_sigma)
        subprocess.run([str(VENV_ASHLAR), str(HERE / "ashlar_cycles_peer.py"), f"{tmp}/in.npz", f"{tmp}/out.npz"],
                       capture_output=True, text=True, check=True)
        out = np.load(f"{tmp}/out.npz")
        ref, mov = out["mosaic1"].astype(np.float32), out["mosaic2"].astype(np.float32)
        seconds = float(out["seconds"])
        placed1, placed2 = out["positions1"], out["positions2"]
    covered = ndimage.binary_erosion((ref > 0) & (mov > 0), iterations=2)
    measured, ok = residuals(ref, mov, covered)
    p = _block_centres(ref.shape)
    return {**measured, **true_summary(truth.error(p, placed1, placed2, p), ok), "s": round(seconds, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--block-px", default="64,128", help="registration.block_px values of the local model")
    args = ap.parse_args()
    world = world_cycles.real_mosaic()
    run_ashlar = not args.no_peers and VENV_ASHLAR.exists()
    rows = []
    for i, regime in enumerate(args.regimes.split(",")):
        tiles1, tiles2, layout, truth = make_cycles(world, regime, 10 + i)
        row = {"regime": regime}
        for model, block in [("translation", BLOCK)] + [("local", int(b)) for b in args.block_px.split(",")]:
            name = f"ours_{model}" + (f"_block{block}" if model == "local" else "")
            try:
                row[name] = ours(tiles1, tiles2, layout, model, truth, block)
            except registration.RegistrationError as exc:
                row[name] = {"refused": str(exc)[:120]}
        if run_ashlar:
            for sigma in (0.0, 1.0):
                row[f"ashlar_filter{sigma:g}"] = ashlar(tiles1, tiles2, sigma, truth)
        rows.append(row)
        print(row, flush=True)
    from common import write_result
    write_result("registration_tiles", rows, notes=(
        f"real wsi_brain world; cycles as {ROWS}x{COLS} tiles of {TILE} px, {OVERLAP:.0%} overlap, stage jitter "
        f"{JITTER_PX} px per tile and cycle, noise per tile; cycle 2 from the world rotated, shifted, deformed "
        "(and its grid offset); ours: stitch each cycle, register the mosaics; ASHLAR 1.20: EdgeAligner + "
        f"LayerAligner, max_shift 30 px; residual = shift of each {BLOCK} px held-out block of the aligned cycle 2 "
        "against cycle 1, reliable blocks wholly covered by both; true_*: at the same blocks, the world point the "
        "aligned cycle 2 shows against the one cycle 1 shows (from where the tiles were cut, the mosaics' tile "
        "positions and the displacement cycle 2 was made with)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
