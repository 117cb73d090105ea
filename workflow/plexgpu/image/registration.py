"""Cross-cycle registration on the NumPy/CuPy seam: each cycle's reference-channel EDF onto the
reference cycle's, in three layers, applied to every channel of the cycle in one interpolation.

A slide that is re-seated between cycles comes back shifted and rotated, the stage never returns to
the same place, and tissue deforms a little; one translation per cycle leaves several pixels of error
across a large mosaic (a 0.1 deg rotation moves the corners of a 12,000 px mosaic by ~10 px). So:

1. **translation**: whitened, windowed phase correlation of the whole images (sub-pixel peak); a peak
   below the noise-only bound or an ambiguous one is an error naming the cycle (never copied
   unregistered).
2. **rigid**: the local shift of every ``block_px`` block (phase correlation around the translation),
   and a rotation + translation fitted to the reliable ones (significant peak, unambiguous, textured),
   outliers rejected iteratively (beyond 3 robust standard deviations or 0.5 px).
3. **local**: the blocks measured again around the rigid model; what the rigid model leaves, on the
   block grid, with a block that disagrees with its neighbours' median by more than MAX_LOCAL_JUMP px
   left out; smoothed by a normalised Gaussian of ``smoothness`` blocks, so an unmeasured block (blank,
   bleached) takes its neighbours' value, and where no block near it was measured the rigid model alone
   holds (``rigid_only``). Never a wild vector: a field value beyond ``max_local_px`` is refused.

``registration.model`` picks the layers: translation | rigid | local (default). The displacement
d(p) maps a reference-frame pixel p to where it is in the moving image: registered(p) = moving(p + d(p)),
sampled once by a cubic spline (translation alone: cubic convolution, as before).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from .. import xp as xpmod
from .phasecorr import phase_correlation, phase_correlation_batch
from .robust import robust_std
from .subpixel import shift_image

MAX_AMBIGUITY = 0.8
MAX_BLOCK_AMBIGUITY = 0.5    # a block with a rival peak above half its best is not measured (bare slide, haze:
                             # on the demo a bare-slide block matched 2.4 px off at significance 7.3, ambiguity 0.9)
MIN_BLOCK_TEXTURE = 1e-3     # a block whose std is below this fraction of the image's is not measured
OUTLIER_SIGMAS = 3.0
MIN_OUTLIER_PX = 0.5         # the rigid fit keeps residuals within max(3 robust std, this)
MAX_LOCAL_JUMP = 1.0         # px: a block this far from what its neighbours predict is left out of the field
OUTLIER_PASSES = 20          # blocks are left out the worst of each neighbourhood at a time, at most this often
MIN_WEIGHT = 0.05            # normalised smoothing weight below this: no measured block near, rigid only
COARSE_PX = 512             # the first translation of the rigid and local models at most this size
STRIP_ROWS = 1024            # rows interpolated at a time (the coordinates of a strip: 2 float32 planes)
BLOCK_BATCH_BYTES = 64 << 20  # blocks measured at once: 64 MiB of float32 blocks per image (1024 blocks of
                             # 128 px; the batch's FFTs and surfaces hold ~10x that on the device)


class RegistrationError(RuntimeError):
    """A cycle that cannot be registered reliably; the message names it."""


@dataclass(frozen=True)
class Shift:
    cycle: str
    dy: float          # moving[y, x] ~ reference[y - dy, x - dx]
    dx: float
    significance: float
    threshold: float


@dataclass
class Transform:
    """Where each reference-frame pixel p lies in a cycle's moving image: p + d(p), with
    d(p) = t + (R(rotation) - I)(p - centre) + field(p), ``field`` bilinear on the block grid."""

    cycle: str
    model: str
    dy: float
    dx: float
    rotation_rad: float = 0.0
    centre: tuple[float, float] = (0.0, 0.0)
    grid_y: np.ndarray = field(default_factory=lambda: np.zeros(0))     # block centres (rows, columns)
    grid_x: np.ndarray = field(default_factory=lambda: np.zeros(0))
    field_dy: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    field_dx: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    measured: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), bool))   # block used in the field
    rigid_only: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), bool))  # no measured block near
    blocks_reliable: int = 0
    blocks_total: int = 0
    significance: float = 0.0
    threshold: float = 0.0

    @property
    def rotation_deg(self) -> float:
        return math.degrees(self.rotation_rad)

    def rigid(self, y, x):
        """The rigid part of d at (arrays of) points y, x."""
        c, s = math.cos(self.rotation_rad) - 1.0, math.sin(self.rotation_rad)
        vy, vx = y - self.centre[0], x - self.centre[1]
        return self.dy + c * vy - s * vx, self.dx + s * vy + c * vx

    def local(self, y, x, xp=np):
        """The local field at points y, x (host or device arrays; 0 without a field)."""
        if self.field_dy.size == 0:
            return xp.zeros(y.shape, xp.float32), xp.zeros(x.shape, xp.float32)
        ndi = xpmod.ndimage(xp)
        gy, gx = [float(v) for v in self.grid_y], [float(v) for v in self.grid_x]     # Python floats: no float64
        # fractional grid coordinates of each point (bilinear, edges held)
        fy = xp.clip((y - gy[0]) / max(gy[1] - gy[0], 1.0) if len(gy) > 1 else y * 0, 0, len(gy) - 1)
        fx = xp.clip((x - gx[0]) / max(gx[1] - gx[0], 1.0) if len(gx) > 1 else x * 0, 0, len(gx) - 1)
        coords = xp.stack([fy.astype(xp.float32), fx.astype(xp.float32)])
        return tuple(ndi.map_coordinates(xpmod.to_device(f.astype(np.float32), xp), coords, order=1, mode="nearest")
                     for f in (self.field_dy, self.field_dx))

    def as_dict(self) -> dict:
        return {"cycle": self.cycle, "model": self.model, "dy_px": self.dy, "dx_px": self.dx,
                "rotation_deg": self.rotation_deg, "centre": list(self.centre),
                "grid_y": [float(v) for v in self.grid_y], "grid_x": [float(v) for v in self.grid_x],
                "field_dy": np.round(self.field_dy, 3).tolist(), "field_dx": np.round(self.field_dx, 3).tolist(),
                "measured": self.measured.tolist(), "rigid_only": self.rigid_only.tolist(),
                "blocks_reliable": self.blocks_reliable, "blocks_total": self.blocks_total,
                "significance": self.significance}


def fit_to_shape(img, shape):
    """Crop or zero-pad a YX image (top-left anchored) to ``shape``."""
    xp = xpmod.array_module(img)
    out = xp.zeros(shape, img.dtype)
    h, w = min(shape[0], img.shape[0]), min(shape[1], img.shape[1])
    out[:h, :w] = img[:h, :w]
    return out


def measure_shift(reference, moving, cycle: str) -> Shift:
    moving = fit_to_shape(moving, reference.shape)
    m = phase_correlation(reference, moving)
    thr = m.noise_threshold
    if m.significance < thr or m.ambiguity > MAX_AMBIGUITY:
        raise RegistrationError(
            f"cycle {cycle}: no reliable match to the reference cycle (peak significance "
            f"{m.significance:.1f}, threshold {thr:.1f}, ambiguity {m.ambiguity:.2f}); "
            "check that this cycle shows the same tissue in its reference channel")
    return Shift(cycle, m.dy, m.dx, m.significance, thr)


def apply_shift(img, shift: Shift, shape):
    """``img`` moved into the reference frame (shape of the reference) at the sub-pixel shift,
    by cubic convolution (linear interpolation blurred by up to half a pixel)."""
    return shift_image(img, (-shift.dy, -shift.dx), tuple(shape))


# ----------------------------------------------------------------------------- blocks
def block_grid(shape, block_px: int, between: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Centres of the blocks that tile the image (rows, columns), blocks ``block_px`` wide, the grid
    centred so the margins are equal; ``between``: the blocks centred between those (half a block
    off), for measuring the result on points the registration did not fit."""
    def axis(n):
        k = max(1, n // block_px)
        start = (n - k * block_px) / 2 + block_px / 2
        centres = start + block_px * np.arange(k)
        return (centres[:-1] + block_px / 2) if between and k > 1 else centres
    return axis(shape[0]), axis(shape[1])


def measure_blocks(reference, moving, grid, block_px: int, predict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Local displacement d (moving(p + d) ~ reference(p)) of every block of ``grid`` and whether it is
    reliable, searched around ``predict(y, x) -> (dy, dx)``. Returns (dy, dx, reliable), each (ny, nx).

    The blocks are cut out by one gather per image and measured BLOCK_BATCH_BYTES at a time in one
    batched phase correlation: a fixed number of device syncs per batch, not several per block."""
    xp = xpmod.array_module(reference)
    gy, gx = grid
    h, w = reference.shape
    half = block_px // 2
    dy = np.zeros((len(gy), len(gx)), np.float32)
    dx = np.zeros_like(dy)
    ok = np.zeros(dy.shape, bool)

    def origin(c, k, n_ref, n_mov):
        """The block's first row (column): at its grid place, moved inward as little as needed to lie
        inside both images (a border block is measured where both hold it); None if it cannot."""
        lo, hi = max(0, -k), min(n_ref, n_mov - k) - block_px
        return None if hi < lo else int(min(max(int(round(c)) - half, lo), hi))

    blocks = []                                               # (i, j, y0, x0, ky, kx) of every block that fits
    for i, cy in enumerate(gy):
        for j, cx in enumerate(gx):
            py, px = (float(v) for v in predict(np.float64(cy), np.float64(cx)))
            ky, kx = int(round(py)), int(round(px))
            y0, x0 = origin(cy, ky, h, moving.shape[0]), origin(cx, kx, w, moving.shape[1])
            if y0 is not None and x0 is not None:             # else the block fits in no common part
                blocks.append((i, j, y0, x0, ky, kx))
    if not blocks:
        return dy, dx, ok
    texture = MIN_BLOCK_TEXTURE * float(xp.std(reference))
    step = np.arange(block_px)
    per_batch = max(1, BLOCK_BATCH_BYTES // (4 * block_px * block_px))
    for b0 in range(0, len(blocks), per_batch):
        batch = np.array(blocks[b0:b0 + per_batch])
        _, _, y0, x0, ky, kx = batch.T

        def cut(img, rows, cols):
            r, c = xp.asarray(rows[:, None, None] + step[None, :, None]), xp.asarray(cols[:, None, None] + step)
            return img[r, c]
        ref, mov = cut(reference, y0, x0), cut(moving, y0 + ky, x0 + kx)
        textured = xpmod.to_host(xp.minimum(ref.std(axis=(1, 2)), mov.std(axis=(1, 2)))) > texture
        matches = phase_correlation_batch(ref, mov, near=(0.0, 0.0), radius=half / 2)
        del ref, mov
        for (bi, bj, _, _, bky, bkx), m, t in zip(batch, matches, textured):
            if not t:
                continue
            dy[bi, bj], dx[bi, bj] = bky + m.dy, bkx + m.dx
            ok[bi, bj] = m.significance >= m.noise_threshold and m.ambiguity <= MAX_BLOCK_AMBIGUITY
    return dy, dx, ok


def fit_rigid(ys, xs, dy, dx, centre) -> tuple[float, float, float, np.ndarray]:
    """Rotation + translation from local displacements (iteratively reweighted: outliers out).
    Returns (ty, tx, rotation_rad, inliers)."""
    vy, vx = ys - centre[0], xs - centre[1]
    keep = np.ones(len(ys), bool)
    t = (float(np.median(dy)), float(np.median(dx)), 0.0)
    for _ in range(8):
        if keep.sum() < 3:
            break
        # d = t + [[a, -b], [b, a]] v  (a similarity, linear), then the rotation of it
        A = np.zeros((2 * keep.sum(), 4))
        A[0::2, 0], A[1::2, 1] = 1, 1
        A[0::2, 2], A[0::2, 3] = vy[keep], -vx[keep]
        A[1::2, 2], A[1::2, 3] = vx[keep], vy[keep]
        b = np.empty(2 * keep.sum())
        b[0::2], b[1::2] = dy[keep], dx[keep]
        ty, tx, a, s = np.linalg.lstsq(A, b, rcond=None)[0]
        theta = math.atan2(s, 1 + a)
        t = (float(ty), float(tx), theta)
        c, sn = math.cos(theta) - 1, math.sin(theta)
        res = np.hypot(dy - (ty + c * vy - sn * vx), dx - (tx + sn * vy + c * vx))
        limit = max(OUTLIER_SIGMAS * robust_std(res[keep], about_zero=True), MIN_OUTLIER_PX)
        new = res <= limit
        if np.array_equal(new, keep):
            break
        keep = new
    return t[0], t[1], t[2], keep


_NEIGHBOURS = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)]


def neighbour_prediction(r, measured) -> tuple[np.ndarray, np.ndarray]:
    """What each block's measured neighbours (its 3 x 3 neighbourhood, itself left out) say its value is:
    the centre of a quadratic surface through them where 5-8 are measured (along the grid's edge, without
    the curvature across it), of a bilinear one through 4, of a plane through 3, their median through 1-2;
    (prediction, how many neighbours it rests on). A smooth deformation bends between blocks, and the neighbours'
    median then sits below a crest by its curvature and off a slope at the grid's edge: at 4 px of warp
    over ~1400 px, 128 px blocks 2 px apart, and good blocks were left out as outliers
    (bench/registration_mosaic.py)."""
    h, w = r.shape
    pad_r = np.pad(np.where(measured, r, 0.0).astype(np.float64), 1)
    pad_m = np.pad(measured, 1)
    vals = np.stack([pad_r[1 + dy:1 + dy + h, 1 + dx:1 + dx + w] for dy, dx in _NEIGHBOURS], -1)   # (h, w, 8)
    have = np.stack([pad_m[1 + dy:1 + dy + h, 1 + dx:1 + dx + w] for dy, dx in _NEIGHBOURS], -1)
    n = have.sum(-1)
    ny, nx = np.array(_NEIGHBOURS, float).T
    design = np.stack([np.ones(8), ny, nx, ny * nx, ny * ny, nx * nx], 1)                    # (8, 6)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)                                      # all-NaN: n == 0
        pred = np.where(n > 0, np.nan_to_num(np.nanmedian(np.where(have, vals, np.nan), axis=-1)), 0.0)
    for terms, least in ((3, 3), (4, 4), (6, 5)):            # plane, bilinear (a twist), quadratic
        sel = n >= least
        if not sel.any():
            continue
        X = design[:, :terms]
        m = have[sel].astype(np.float64)                                                     # (k, 8)
        # a curvature the neighbours cannot show (along the grid's edge: two columns) is taken as none
        ridge = np.diag([1e-9] * min(terms, 4) + [1e-6] * max(terms - 4, 0))
        A = np.einsum("ki,ia,ib->kab", m, X, X) + ridge
        rhs = np.einsum("ki,ia,ki->ka", m, X, vals[sel])
        pred[sel] = np.linalg.solve(A, rhs[..., None])[:, 0, 0]
    return pred, n


def smooth_field(ry, rx, measured, smoothness: float):
    """Residual displacements on the block grid -> the field: a block farther than MAX_LOCAL_JUMP from what
    its measured neighbours predict (``neighbour_prediction``) is left out, the worst of its neighbourhood
    first and the test repeated without it (a wild block skews its neighbours' predictions only until it is
    out; one that agrees then is taken back); a measured block keeps its own value (a block's phase
    correlation is good to a few hundredths of a pixel: smoothing it would flatten real deformation, 15 % of
    a 2.5 px warp at one block); a block left out or unmeasured
    takes its neighbours' values by a normalised Gaussian of ``smoothness`` blocks (not their surface's
    value there: on tile mosaics, where the blocks left out are the weakly textured ones, that extrapolated
    their neighbours' noise, worst block 0.49 -> 0.70 px against the truth), and none: the rigid model
    alone. Returns (field_dy, field_dx, used, rigid_only)."""
    from scipy import ndimage

    def deviation(used):
        """How far each block is from what the used blocks around it predict, in tolerances (0 where none
        predicts): MAX_LOCAL_JUMP, twice that where 4 or fewer neighbours predict (a grid corner: a plane
        extrapolated, which a bend of the field moves by up to ~1 px more at 4 px of warp)."""
        dev = np.zeros(ry.shape)
        for r in (ry, rx):
            pred, n = neighbour_prediction(r, used)
            tol = np.where(n >= 5, MAX_LOCAL_JUMP, 2 * MAX_LOCAL_JUMP)
            dev = np.maximum(dev, np.where(n > 0, np.abs(r - pred) / tol, 0.0))
        return dev

    used = measured.copy()
    for _ in range(OUTLIER_PASSES):          # the worst block of its neighbourhood first: a wild block skews
        dev = np.where(used, deviation(used), 0.0)   # its neighbours' predictions, not they its
        worst = used & (dev > 1) & (dev >= ndimage.maximum_filter(dev, size=3, mode="constant"))
        if not worst.any():
            break
        used &= ~worst
    for _ in range(OUTLIER_PASSES):          # taken back, as long as some agree once the wild ones are out
        back = measured & ~used & (deviation(used) <= 1)
        if not back.any():
            break
        used |= back
    wsum = ndimage.gaussian_filter(used.astype(np.float64), smoothness, mode="nearest")
    out = []
    for r in (ry, rx):
        num = ndimage.gaussian_filter(np.where(used, r, 0).astype(np.float64), smoothness, mode="nearest")
        filled = np.where(wsum >= MIN_WEIGHT, num / np.maximum(wsum, 1e-12), 0)
        out.append(np.where(used, r, filled).astype(np.float32))
    return out[0], out[1], used, (wsum < MIN_WEIGHT) & ~used


def _coarse(img, factor: int):
    """Box-mean downsampling by an integer factor (a shift scales by exactly the factor)."""
    if factor == 1:
        return img
    h, w = (img.shape[0] // factor) * factor, (img.shape[1] // factor) * factor
    return img[:h, :w].reshape(h // factor, factor, w // factor, factor).mean(axis=(1, 3))


def register_cycle(reference, moving, cycle: str, model: str = "local", block_px: int = 128,
                   smoothness: float = 1.0, max_local_px: float = 20.0) -> Transform:
    """The transform that brings ``moving`` onto ``reference`` (same pixel size), by ``model``.

    For the rigid and local models the first translation is measured on images box-downsampled to at
    most COARSE_PX: a rotation smears the whole-image correlation peak over (rotation x size) px, which
    at full size splits it into rival peaks; the blocks then measure at full resolution."""
    if model == "translation":
        s = measure_shift(reference, moving, cycle)
        return Transform(cycle, model, s.dy, s.dx, significance=s.significance, threshold=s.threshold)
    factor = max(1, -(-max(reference.shape) // COARSE_PX))
    s = measure_shift(_coarse(reference, factor), _coarse(fit_to_shape(moving, reference.shape), factor), cycle)
    tr = Transform(cycle, model, s.dy * factor, s.dx * factor, significance=s.significance, threshold=s.threshold)
    s = Shift(cycle, tr.dy, tr.dx, s.significance, s.threshold)
    h, w = reference.shape
    tr.centre = ((h - 1) / 2, (w - 1) / 2)
    grid = block_grid(reference.shape, block_px)
    gy, gx = np.meshgrid(*grid, indexing="ij")
    dy, dx, ok = measure_blocks(reference, moving, grid, block_px, lambda y, x: (s.dy, s.dx))
    tr.blocks_total = ok.size
    if ok.sum() >= 3:
        ty, tx, theta, inl = fit_rigid(gy[ok], gx[ok], dy[ok], dx[ok], tr.centre)
        if inl.sum() >= 3:
            tr.dy, tr.dx, tr.rotation_rad = ty, tx, theta
    tr.grid_y, tr.grid_x = grid
    if model == "rigid":
        tr.blocks_reliable = int(ok.sum())
        return tr
    dy, dx, ok = measure_blocks(reference, moving, grid, block_px, tr.rigid)       # around the rigid model
    ry, rx = tr.rigid(gy, gx)
    fy, fx, used, rigid_only = smooth_field(dy - ry, dx - rx, ok, smoothness)
    big = float(max(np.abs(fy).max(initial=0), np.abs(fx).max(initial=0)))
    if big > max_local_px:
        raise RegistrationError(f"cycle {cycle}: the local refinement would move tissue by {big:.1f} px beyond the "
                                f"rigid model (registration.max_local_px = {max_local_px}); check that the cycle "
                                "shows the same tissue, or raise the limit")
    tr.field_dy, tr.field_dx, tr.measured, tr.rigid_only = fy, fx, used, rigid_only
    # once more on the result: a block measures the mean displacement over it, so where the field bends
    # within a block what is left is measured on the registered image and added (d + r, r small)
    ry2, rx2, ok2 = measure_blocks(reference, apply_transform(moving, tr, reference.shape), grid, block_px,
                                   lambda y, x: (0.0, 0.0))
    fy2, fx2, _, _ = smooth_field(ry2, rx2, ok2 & used, smoothness)
    tr.field_dy, tr.field_dx = fy + np.where(used, fy2, 0), fx + np.where(used, fx2, 0)
    tr.blocks_reliable = int(used.sum())
    return tr


def _source_strips(tr: Transform, shape, moving_shape, xp):
    """Row strips of the reference frame ``shape``: (first row, qy, qx, inside) with (qy, qx) = p + d(p),
    where each pixel is read from in the moving image, and whether that lies on it (STRIP_ROWS rows at a
    time bound the coordinates' memory)."""
    xs = xp.arange(shape[1], dtype=xp.float32)
    for r0 in range(0, shape[0], STRIP_ROWS):
        rows = xp.arange(r0, min(r0 + STRIP_ROWS, shape[0]), dtype=xp.float32)
        y, x = xp.meshgrid(rows, xs, indexing="ij")
        ry, rx = tr.rigid(y, x)
        ly, lx = tr.local(y, x, xp)
        qy, qx = y + ry + ly, x + rx + lx
        del y, x, ry, rx, ly, lx
        inside = (qy >= -0.5) & (qy <= moving_shape[0] - 0.5) & (qx >= -0.5) & (qx <= moving_shape[1] - 0.5)
        yield r0, qy, qx, inside


def apply_transform(img, tr: Transform, shape):
    """``img`` resampled into the reference frame of ``shape``: registered(p) = img(p + d(p)), one cubic
    spline interpolation (zero outside the image; no negatives where the image has none)."""
    if tr.model == "translation":
        return shift_image(img, (-tr.dy, -tr.dx), tuple(shape))
    xp = xpmod.array_module(img)
    ndi = xpmod.ndimage(xp)
    img = xp.asarray(img, dtype=xp.float32)
    coeffs = ndi.spline_filter(img, order=3, output=xp.float32, mode="mirror")
    out = xp.zeros(tuple(shape), xp.float32)
    for r0, qy, qx, inside in _source_strips(tr, shape, img.shape, xp):
        vals = ndi.map_coordinates(coeffs, xp.stack([qy, qx]), order=3, mode="mirror", prefilter=False)
        out[r0:r0 + qy.shape[0]] = xp.where(inside, vals, 0)
        del qy, qx, inside, vals
    if img.size and float(img.min()) >= 0:
        xp.maximum(out, 0, out=out)
    return out


def coverage(moving_shape, tr: Transform, shape, xp=np):
    """Where the registered image holds data of the moving image (not the zero beyond its edge), on ``xp``:
    the pixels whose source lies on the moving image (no interpolation; a translation's by its shift)."""
    if tr.model == "translation":
        return shift_image(xp.ones(moving_shape, xp.float32), (-tr.dy, -tr.dx), tuple(shape)) > 0.99
    out = xp.zeros(tuple(shape), bool)
    for r0, qy, _, inside in _source_strips(tr, shape, moving_shape, xp):
        out[r0:r0 + qy.shape[0]] = inside
    return out


def local_residuals(reference, registered, block_px: int, covered=None) -> tuple[np.ndarray, np.ndarray]:
    """What is left after registration, block by block: |d| of each block of the registered image
    against the reference (NaN where a block could not be measured), and the reliable mask; on the
    blocks centred between the registration's own (held out: not the points it was fitted to). Blocks
    not wholly ``covered`` by the moving image are not measured (its edge against the zero beyond
    would be a false match)."""
    grid = block_grid(reference.shape, block_px, between=True)
    dy, dx, ok = measure_blocks(reference, registered, grid, block_px, lambda y, x: (0.0, 0.0))
    if covered is not None:
        half = block_px // 2
        for i, cy in enumerate(grid[0]):
            for j, cx in enumerate(grid[1]):
                y0, x0 = max(int(round(cy)) - half, 0), max(int(round(cx)) - half, 0)
                ok[i, j] &= bool(np.all(covered[y0:y0 + block_px, x0:x0 + block_px]))
    return np.where(ok, np.hypot(dy, dx), np.nan), ok
