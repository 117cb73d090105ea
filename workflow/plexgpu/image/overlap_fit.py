"""The offset of two neighbouring tiles refined on their exact overlap, on the NumPy/CuPy seam.

Phase correlation measures a pair on strips cut at the nominal step. Where the overlap is narrow
(5 % of a tile: 13 px of 256) that fails twice over: the strips share only part of their width
when the stage is a few pixels off, and the Hann window leaves a few pixels of the narrow axis to
measure on (measured on synthetic tiles: pairs 1-2 px wrong at 5 % overlap, 0.02 px at 20 %).
The translation is still well determined there, by the texture along the strip's long axis.

Here the pair is fitted where it really overlaps: tile a against tile b sampled at the current
offset (cubic spline), a = gain * b(y - oy, x - ox) + level, by Gauss-Newton (Lucas & Kanade,
IJCAI 1981) on both tiles smoothed alike (smoothing both by one kernel leaves their offset as it
is and takes the noise out of b's gradients), first broadly (a start up to ~2 px off) then finely. The smoothing is
applied to a's overlap and to b as sampled on the same pixels (not to the whole tiles, whose
borders are the overlap's borders: smoothing there would move one tile's edge against the other's;
measured on wsi_brain, a 0.17 px bias along the step).
The overlap is recut at every step, so no part of it is lost to a window or to the offset.
The fit is kept only where it raises the normalised cross-correlation of the exact overlap; the
caller keeps it within the stage model's window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import xp as xpmod
from .robust import robust_std

SIGMAS = (2.0, 1.0)       # Gaussian smoothing of both tiles per pass (px): broad first, then fine
ITERATIONS = 12           # Gauss-Newton steps per pass at most ...
TOLERANCE_PX = 0.005      # ... until the step is below this
MAX_MOVE_PX = 3.0         # a fit moving further than this from its start has lost the overlap: not kept
MARGIN = 3                # px kept clear of each tile's border (spline support and smoothing)
ROBUST_C = 3.0            # Cauchy weight scale, in robust stds of the residual
MIN_PIXELS = 64           # an overlap smaller than this is not fitted


@dataclass(frozen=True)
class OverlapFit:
    offset: tuple[float, float]   # b's top-left relative to a's, px
    ncc: float                    # of the exact overlap at that offset
    start_ncc: float              # ... at the offset it started from
    moved: bool                   # the fit was kept (it raised the NCC)


def _region(shape, offset):
    """Pixels (y0, y1, x0, x1) of tile a that lie inside tile b placed at ``offset``, MARGIN px
    inside both."""
    h, w = shape
    oy, ox = offset
    y0, y1 = max(0, math.ceil(oy)) + MARGIN, min(h, math.floor(h + oy)) - MARGIN
    x0, x1 = max(0, math.ceil(ox)) + MARGIN, min(w, math.floor(w + ox)) - MARGIN
    return y0, y1, x0, x1


def _sampler(xp, b):
    """Spline coefficients of b and of its y and x central differences."""
    ndi = xpmod.ndimage(xp)
    gy, gx = xp.gradient(b)
    return [ndi.spline_filter(v, order=3, output=xp.float32, mode="nearest") for v in (b, gy, gx)]


def _sample(xp, coeffs, region, offset):
    """The arrays of ``coeffs`` sampled on tile a's pixels ``region`` with b placed at ``offset``,
    each (y1 - y0, x1 - x0)."""
    ndi = xpmod.ndimage(xp)
    y0, y1, x0, x1 = region
    yy, xx = xp.meshgrid(xp.arange(y0, y1, dtype=xp.float32) - np.float32(offset[0]),
                         xp.arange(x0, x1, dtype=xp.float32) - np.float32(offset[1]), indexing="ij")
    coords = xp.stack([yy.ravel(), xx.ravel()])
    return [ndi.map_coordinates(c, coords, order=3, mode="nearest", prefilter=False).reshape(yy.shape)
            for c in coeffs]


def _ncc(xp, a, b) -> float:
    a = a - a.mean()
    b = b - b.mean()
    den = float(xp.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum()) / den if den > 0 else 0.0


def exact_ncc(ta, tb, offset, b_coeffs=None) -> float:
    """NCC of tile a and tile b (unsmoothed, cubic spline) where b placed at ``offset`` overlaps a;
    ``b_coeffs``: b's spline coefficients where the caller holds them already (``_sampler``'s first)."""
    xp = xpmod.array_module(ta, tb)
    ta, tb = xp.asarray(ta, xp.float32), xp.asarray(tb, xp.float32)
    region = _region(ta.shape, offset)
    if (region[1] - region[0]) * (region[3] - region[2]) < MIN_PIXELS:
        return 0.0
    coeffs = [b_coeffs if b_coeffs is not None else
              xpmod.ndimage(xp).spline_filter(tb, order=3, output=xp.float32, mode="nearest")]
    y0, y1, x0, x1 = region
    return _ncc(xp, ta[y0:y1, x0:x1].ravel(), _sample(xp, coeffs, region, offset)[0].ravel())


def fit_offset(ta, tb, offset) -> OverlapFit:
    """Refine b's offset relative to a (``offset``: (oy, ox) px, top-left to top-left) on their exact
    overlap; see the module doc. Host or device tiles."""
    xp = xpmod.array_module(ta, tb)
    ndi = xpmod.ndimage(xp)
    ta, tb = xp.asarray(ta, xp.float32), xp.asarray(tb, xp.float32)
    start = (float(offset[0]), float(offset[1]))
    coeffs = _sampler(xp, tb)
    start_ncc = exact_ncc(ta, tb, start, coeffs[0])
    o = np.array(start)
    sol = None
    for sigma in SIGMAS:
        for _ in range(ITERATIONS):
            region = _region(ta.shape, o)
            y0, y1, x0, x1 = region
            if (y1 - y0) * (x1 - x0) < MIN_PIXELS:
                return OverlapFit(start, start_ncc, start_ncc, False)
            # one smoothing applied to a's overlap and to b sampled on the same pixels: a linear filter
            # of both sides keeps a = gain b + level exact whatever it does at the overlap's borders
            a, B, By, Bx = (ndi.gaussian_filter(v, sigma, mode="nearest").ravel()
                            for v in [ta[y0:y1, x0:x1]] + _sample(xp, coeffs, region, o))
            py, px = (v.ravel() for v in xp.meshgrid(xp.linspace(-1, 1, y1 - y0, dtype=xp.float32),
                                                     xp.linspace(-1, 1, x1 - x0, dtype=xp.float32), indexing="ij"))
            # a ~ G B + C - G (By dy + Bx dx), G and C planes over the overlap (the shading left after the
            # first correction differs between the two tiles' sides: a gain ramp on blobs mimics a shift);
            # moving b by d samples it at (y - oy - dy, x - ox - dx)
            if sol is None:
                gain = xp.full_like(B, float((a - a.mean()) @ (B - B.mean())) / max(float(((B - B.mean()) ** 2).sum()),
                                                                                   1e-12))
            else:
                gain = np.float32(sol[2]) + np.float32(sol[3]) * py + np.float32(sol[4]) * px
            J = xp.stack([-gain * By, -gain * Bx, B, B * py, B * px, xp.ones_like(B), py, px], 1)
            res = a - gain * B
            res = res - xp.median(res)
            scale = np.float32(robust_std(res, about_zero=True) + 1e-6)
            wt = xp.sqrt(1 / (1 + (res / (np.float32(ROBUST_C) * scale)) ** 2))   # Cauchy: dust, one-tile objects
            Jw = J * wt[:, None]
            # the 8 x 8 normal equations, formed on the device (float32), solved on the host in float64
            try:
                sol = np.linalg.solve(*(xpmod.to_host(v).astype(np.float64) for v in (Jw.T @ Jw, Jw.T @ (a * wt))))
            except np.linalg.LinAlgError:            # nothing in the overlap to fit on (a flat patch)
                return OverlapFit(start, start_ncc, start_ncc, False)
            step = sol[:2]
            o = o + step
            if not np.all(np.isfinite(o)) or np.abs(o - start).max() > MAX_MOVE_PX:
                return OverlapFit(start, start_ncc, start_ncc, False)
            if np.abs(step).max() < TOLERANCE_PX:
                break
    end = (float(o[0]), float(o[1]))
    end_ncc = exact_ncc(ta, tb, end, coeffs[0])
    if end_ncc <= start_ncc:
        return OverlapFit(start, start_ncc, start_ncc, False)
    return OverlapFit(end, end_ncc, start_ncc, True)
