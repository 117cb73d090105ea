"""Phase correlation on the NumPy/CuPy seam: the translation between two images,
with a significance score that tells a real match from noise.

Convention: ``shift = (dy, dx)`` such that ``b[y, x] ~= a[y - dy, x - dx]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import xp as xpmod

EXCLUDE = 3          # half width of the peak neighbourhood left out of the noise estimate
SIGNIFICANCE_MARGIN = 3.0


@dataclass(frozen=True)
class Match:
    dy: float
    dx: float
    significance: float      # (peak - mean) / std of the correlation surface away from the peak
    ambiguity: float         # second-highest separate peak / highest (1 = two equal peaks)
    n: int                   # number of samples of the surface

    @property
    def noise_threshold(self) -> float:
        """Extreme-value bound: the largest of n Gaussian noise samples is ~sqrt(2 ln n) std; plus a margin."""
        return math.sqrt(2.0 * math.log(max(self.n, 2))) + SIGNIFICANCE_MARGIN


def hann2d(xp, shape):
    wy = xp.hanning(shape[0]).astype(xp.float32) if shape[0] > 1 else xp.ones(1, xp.float32)
    wx = xp.hanning(shape[1]).astype(xp.float32) if shape[1] > 1 else xp.ones(1, xp.float32)
    return wy[:, None] * wx[None, :]


def _parabolic(c_m, c_0, c_p) -> float:
    denom = c_m - 2 * c_0 + c_p
    if denom >= 0:
        return 0.0
    return float(np.clip(0.5 * (c_m - c_p) / denom, -0.5, 0.5))


def phase_correlation(a, b, window: bool = True) -> Match:
    """Whitened, windowed phase correlation of two same-shape images (host or device)."""
    xp = xpmod.array_module(a, b)
    fft = xpmod.fft(xp)
    a = xp.asarray(a, dtype=xp.float32)
    b = xp.asarray(b, dtype=xp.float32)
    if a.shape != b.shape:
        raise ValueError(f"phase_correlation needs equal shapes, got {a.shape} and {b.shape}")
    a = a - a.mean()
    b = b - b.mean()
    if float(xp.abs(a).max()) == 0 or float(xp.abs(b).max()) == 0:
        return Match(0.0, 0.0, 0.0, 1.0, a.size)  # a constant image has nothing to match
    if window:
        w = hann2d(xp, a.shape)
        a, b = a * w, b * w
    A, B = fft.rfft2(a), fft.rfft2(b)
    R = xp.conj(A) * B
    mag = xp.abs(R)
    R = R / xp.maximum(mag, 1e-9 * float(mag.max()))
    surf = fft.irfft2(R, s=a.shape)
    h, w_ = surf.shape
    flat_idx = int(xp.argmax(surf))
    py, px = divmod(flat_idx, w_)
    s = xpmod.to_host(surf)
    peak = float(s[py, px])
    dy = py + _parabolic(s[(py - 1) % h, px], peak, s[(py + 1) % h, px])
    dx = px + _parabolic(s[py, (px - 1) % w_], peak, s[py, (px + 1) % w_])
    dy = dy - h if dy > h / 2 else dy
    dx = dx - w_ if dx > w_ / 2 else dx
    mask = np.ones(s.shape, bool)
    for oy in range(-EXCLUDE, EXCLUDE + 1):
        for ox in range(-EXCLUDE, EXCLUDE + 1):
            mask[(py + oy) % h, (px + ox) % w_] = False
    rest = s[mask]
    std = float(rest.std()) or 1e-12
    second = float(rest.max()) if rest.size else 0.0
    return Match(dy=float(dy), dx=float(dx), significance=(peak - float(rest.mean())) / std,
                 ambiguity=max(second, 0.0) / peak if peak > 0 else 1.0, n=s.size)


def ncc(a, b) -> float:
    """Normalised cross-correlation of two same-shape arrays (host or device)."""
    xp = xpmod.array_module(a, b)
    a = xp.asarray(a, dtype=xp.float64).ravel()
    b = xp.asarray(b, dtype=xp.float64).ravel()
    a = a - a.mean()
    b = b - b.mean()
    den = float(xp.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum()) / den if den > 0 else 0.0
