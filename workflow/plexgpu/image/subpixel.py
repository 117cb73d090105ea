"""Moving images by fractions of a pixel on the NumPy/CuPy seam: separable cubic convolution
(Keys, IEEE TASSP 29, 1153 (1981), a = -0.5), 4 taps per axis. Used to place tiles at their
sub-pixel positions in the mosaic and cycles at their sub-pixel shifts after registration;
about ten times cheaper than a cubic spline (no prefilter), with the same flux and flat areas."""

from __future__ import annotations

import math

import numpy as np

from .. import xp as xpmod


def _keys(x: np.ndarray) -> np.ndarray:
    """The cubic convolution kernel at distances x."""
    x = np.abs(x)
    return np.where(x <= 1, (1.5 * x - 2.5) * x * x + 1,
                    np.where(x < 2, ((-0.5 * x + 2.5) * x - 4) * x + 2, 0.0))


def shift_fraction(tile, frac):
    """``tile`` moved by a fraction of a pixel: out[k] = tile(k - frac) per axis, frac in [0, 1)
    (borders: nearest). Flux and flat areas are kept."""
    xp = xpmod.array_module(tile)
    ndi = xpmod.ndimage(xp)
    out = tile.astype(xp.float32, copy=False)
    for axis, f in enumerate(frac):
        if f == 0:
            continue
        taps = _keys(np.arange(-2, 2) + f)          # neighbours k-2 .. k+1 of the sample point k - f
        out = ndi.correlate1d(out, xp.asarray((taps / taps.sum()).astype(np.float32)), axis=axis, mode="nearest")
    return out


def shift_image(img, shift: tuple[float, float], shape: tuple[int, int]):
    """``img`` moved by ``shift`` (out[y, x] = img(y - dy, x - dx)) into a ``shape`` frame, zero
    outside; whole pixels by copying, the fraction by ``shift_fraction``. Images without negative
    values stay without (the kernel's negative lobes would undershoot at sharp edges)."""
    xp = xpmod.array_module(img)
    img = xp.asarray(img, dtype=xp.float32)
    whole = [int(math.floor(v)) for v in shift]
    out = xp.zeros(shape, xp.float32)
    src, dst = [], []
    for k, n_in, n_out in zip(whole, img.shape, shape):
        lo, hi = max(0, k), min(n_out, n_in + k)           # out[lo:hi] = img[lo - k:hi - k]
        if hi <= lo:
            return out
        dst.append(slice(lo, hi))
        src.append(slice(lo - k, hi - k))
    out[tuple(dst)] = img[tuple(src)]
    out = shift_fraction(out, [v - k for v, k in zip(shift, whole)])
    if img.size and float(img.min()) >= 0:
        xp.maximum(out, 0, out=out)
    return out
