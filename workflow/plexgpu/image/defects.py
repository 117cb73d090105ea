"""Defective sensor pixels (hot, stuck, dead), found from their persistence, on the NumPy/CuPy seam.

Every sCMOS camera has pixels whose reading does not follow the light: hot pixels (dark current:
hundreds to thousands of counts more than their neighbours in every frame), stuck pixels (one value
whatever the light) and dead ones (no response). They sit at the same sensor position in every tile
of every cycle, while the specimen's structure lands somewhere else in each tile. So, per tile, the
residual from its 3 x 3 median r = tile - median3x3(tile); per sensor pixel the median of r over the
tiles cancels the specimen and leaves the defect. Left in, identical spikes in every tile give
phase correlation a peak at zero shift (pairs rejected, tiles misplaced) and BaSiC a flatfield
spike.

A pixel is **hot** (or **cold**) where that median residual is above (below) DEFECT_SIGMAS robust
standard deviations of the map, and at least MIN_EXCESS counts; **stuck** where its reading varies
across the tiles less than STUCK_FRACTION of what its neighbours' readings do. A dark frame from the
user, where given, is read the same way (one frame: its residual from its own 3 x 3 median). Found
pixels are replaced, in every tile of every plane, by the median of their 8 neighbours before BaSiC
and stitching.

An sCMOS sensor reads each column through its own amplifier, so its offset carries a fixed pattern of
**column offsets** (a few counts to 2 % of the offset) that persists the same way
(``column_offsets``). A smooth offset model cannot hold it: left in, it stripes every tile of the
mosaic (a dim marker's background is a few counts) and its lowest columns pull the lower support the
offset is fitted under. The pattern is measured per channel, made part of the subtracted offset and
taken out of the tiles before BaSiC's envelope.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from .. import xp as xpmod
from .basic import DARK_QUANTILE
from .robust import robust_std

DEFECT_SIGMAS = 10.0     # |median residual| beyond this many robust stds of the map: a defect
MIN_EXCESS = 50.0        # ... and at least this many counts (noise of a median over few tiles)
STUCK_FRACTION = 0.05    # a reading varying across tiles less than this fraction of its neighbours': stuck
COLUMN_SMOOTH = 8.0      # px: a column's offset is against a Gaussian of this sigma across the columns: far
                         # wider than one column (the pattern), far narrower than a flatfield's curvature
CHANCE_SIGMAS = 3.0      # column offsets: the halves' correlation must exceed this many of its standard errors
                         # under no pattern (1 / sqrt(columns)), or nothing is subtracted
MIN_TILES = 5            # fewer tiles: persistence cannot be told from the specimen; nothing is looked for
_NEIGHBOURS = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)]


@dataclass(frozen=True)
class Defects:
    """Defective pixels of one sensor: positions, kind and median excess over the 3 x 3 median (counts)."""

    y: np.ndarray
    x: np.ndarray
    kind: list[str]
    excess: np.ndarray
    shape: tuple[int, int]

    def __len__(self) -> int:
        return len(self.y)

    def counts(self) -> dict[str, int]:
        return {k: self.kind.count(k) for k in ("hot", "cold", "stuck", "dark frame")}

    def csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["y", "x", "kind", "excess_counts"])
        for y, x, k, e in zip(self.y, self.x, self.kind, self.excess):
            w.writerow([int(y), int(x), k, f"{float(e):.1f}"])
        return buf.getvalue()

    def union(self, other: "Defects") -> "Defects":
        seen = {(int(y), int(x)) for y, x in zip(self.y, self.x)}
        keep = [i for i, (y, x) in enumerate(zip(other.y, other.x)) if (int(y), int(x)) not in seen]
        return Defects(np.concatenate([self.y, other.y[keep]]), np.concatenate([self.x, other.x[keep]]),
                       self.kind + [other.kind[i] for i in keep], np.concatenate([self.excess, other.excess[keep]]),
                       self.shape)


def none(shape) -> Defects:
    return Defects(np.zeros(0, int), np.zeros(0, int), [], np.zeros(0, np.float32), tuple(shape))


def stack_tiles(tiles, xp):
    """One plane's tiles (a list of YX arrays, host or device) as one float32 (N, Y, X) device array, for
    ``find_defects`` and ``column_offsets`` to share (one copy to the device)."""
    return xp.stack([xpmod.to_device(t, xp).astype(xp.float32) for t in tiles])


def find_defects(tiles, xp=None) -> Defects:
    """Defective pixels from one plane's tiles (a list of YX arrays of one sensor, host or device, or
    their ``stack_tiles``)."""
    xp = xp or xpmod.array_module(tiles[0])
    shape = tuple(tiles[0].shape)
    if len(tiles) < MIN_TILES:
        return none(shape)
    ndi = xpmod.ndimage(xp)
    stack = tiles if getattr(tiles, "ndim", 0) == 3 else stack_tiles(tiles, xp)
    residual = stack - ndi.median_filter(stack, size=(1, 3, 3), mode="nearest")
    persistent = xp.median(residual, axis=0)                     # the specimen cancels, the sensor stays
    del residual
    spread = xp.std(stack, axis=0)                               # how much each reading follows the light
    del stack
    sigma = robust_std(persistent) + 1e-6
    limit = max(DEFECT_SIGMAS * sigma, MIN_EXCESS)
    hot = persistent > limit
    cold = persistent < -limit
    around = ndi.median_filter(spread, size=3, mode="nearest")
    stuck = (spread < STUCK_FRACTION * around) & ~hot & ~cold
    out = []
    for kind, mask in (("hot", hot), ("cold", cold), ("stuck", stuck)):
        ys, xs = (xpmod.to_host(a) for a in xp.nonzero(mask))
        out.append(Defects(ys, xs, [kind] * len(ys), xpmod.to_host(persistent[mask]).astype(np.float32), shape))
    found = out[0]
    for d in out[1:]:
        found = found.union(d)
    return found


def column_offsets(tiles, xp=None) -> np.ndarray:
    """The sensor's column offsets (W,) in counts, zero mean, from one plane's tiles (host or device, or
    their ``stack_tiles``).

    Where the tiles are dimmest the camera shows most of itself: per sensor pixel the low envelope over
    the tiles (their DARK_QUANTILE, as BaSiC's darkfield takes it, at full size); per column the mean of
    the middle half of its values; what is smooth across the columns (the offset's own smooth part,
    fitted elsewhere, and the specimen's floor under the flatfield) taken out by a Gaussian of
    COLUMN_SMOOTH px. Only the pattern's fast part is measured: its slow part cannot be told from the
    floor under the flatfield's dome. (Kept down to a quarter of the width, 128 x 160 tiles with a 450-
    count offset and a +-2 % pattern were fitted 3.7 / 4.7 counts low instead of 7.6 / 10.8, but on
    data not looked at while making it, 20 % vignetting, 7.9 -> 11.1 counts low and one channel no
    longer flagged; with COLUMN_SMOOTH, bench/stitch_sweep.py's offsets are closer in 8 of 11 regimes,
    by 0.2-2.5 counts, and 0.1-0.2 further in 3.)

    The specimen's floor leaves noise in that estimate; the pattern is scaled by its reliability, the
    part of it that repeats between the estimates from the second and from the third quarter of the
    sensor's rows (split-half correlation r; for the two together 2r / (1 + r)), which is what is
    returned: a pattern buried in the specimen is not subtracted as if it were measured. None at all
    where the halves' column-to-column differences (where the specimen, smooth across neighbouring
    columns, has least power and the pattern all of its own) are no more alike than CHANCE_SIGMAS
    standard errors of two unrelated profiles (160 columns: r 0.13 by chance gave a 6-count pattern
    where there is 1.2). The halves are of rows, not of tiles: the low envelope of half the tiles is far
    above that of all of them where every tile holds specimen (DAPI, 512 x 640 tiles: each half of the
    tiles correlated 0.19-0.25 with the true pattern, all of them 1.00). And of the middle rows: a tile's top rows hold the
    specimen its upper neighbour holds in its bottom rows, at the same columns (dense DAPI, top against
    bottom half: a 10.7-count pattern found where there is 1.2); the middle quarters share none for any
    overlap up to half a tile. Zeros when there are too few tiles to tell the sensor from the specimen."""
    xp = xp or xpmod.array_module(tiles[0])
    height, width = (int(n) for n in tiles[0].shape[-2:])
    if len(tiles) < MIN_TILES or width < 32 or height < 16:
        return np.zeros(width, np.float32)
    stack = tiles if getattr(tiles, "ndim", 0) == 3 else stack_tiles(tiles, xp)
    low = xp.sort(stack, axis=0)[int(DARK_QUANTILE * (len(tiles) - 1))]
    del stack

    def pattern(rows):
        values = xp.sort(rows, axis=0)
        h = values.shape[0]
        profile = xpmod.to_host(values[h // 4: h - h // 4].mean(axis=0)).astype(np.float64)  # integer counts
        c = profile - ndimage.gaussian_filter1d(profile, COLUMN_SMOOTH, mode="mirror")
        return c - c.mean()

    q = height // 4
    top, bottom = pattern(low[q:2 * q]), pattern(low[2 * q:3 * q])

    def alike(a, b) -> float:
        return float(np.corrcoef(a, b)[0, 1]) if min(a.std(), b.std()) > 0 else 0.0

    if alike(np.diff(top), np.diff(bottom)) < CHANCE_SIGMAS / np.sqrt(width - 2):  # column to column: as two
        return np.zeros(width, np.float32)                                         # unrelated profiles
    # Wiener filter: the pattern is white (its power the same at every spatial frequency: measured where
    # the specimen is weakest, the upper half, as the halves' cross-power); the specimen's noise in the
    # mean of the halves is half their difference (its power smoothed over neighbouring frequencies)
    a, b = np.fft.rfft(top), np.fft.rfft(bottom)
    upper = slice(a.size // 2, None)
    signal = max(float(np.mean((a[upper] * np.conj(b[upper])).real)), 0.0)
    noise = ndimage.uniform_filter1d(np.abs(a - b) ** 2 / 4, 9, mode="nearest")
    kept = np.fft.irfft((a + b) / 2 * signal / (signal + noise + 1e-12), n=width)
    return (kept - kept.mean()).astype(np.float32)


def defects_in_dark_frame(frame: np.ndarray) -> Defects:
    """Hot pixels of a dark frame: its residual from its own 3 x 3 median, beyond the same limit."""
    frame = np.asarray(frame, np.float32)
    residual = frame - ndimage.median_filter(frame, size=3, mode="nearest")
    limit = max(DEFECT_SIGMAS * (robust_std(residual) + 1e-6), MIN_EXCESS)
    ys, xs = np.nonzero(np.abs(residual) > limit)
    return Defects(ys, xs, ["dark frame"] * len(ys), residual[ys, xs], tuple(frame.shape))


def repair(tile, defects: Defects):
    """The tile with each defective pixel replaced by the median of its 8 neighbours (a copy)."""
    if not len(defects):
        return tile
    xp = xpmod.array_module(tile)
    h, w = defects.shape
    ys, xs = xpmod.to_device(defects.y, xp), xpmod.to_device(defects.x, xp)
    around = xp.stack([tile[xp.clip(ys + dy, 0, h - 1), xp.clip(xs + dx, 0, w - 1)] for dy, dx in _NEIGHBOURS])
    out = tile.copy()
    out[ys, xs] = xp.median(around.astype(xp.float32), axis=0).astype(tile.dtype)
    return out
