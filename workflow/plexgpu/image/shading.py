"""Shading of one plane from what the tiles show twice: the flatfield refined on the tile
overlaps, and the camera offset under the dimmest tiles.

BaSiC (``basic``) estimates the flatfield from statistics: the average tile of a specimen
is assumed flat. With tens of tiles, dense stains, tissue edges and bare slide that average is
not flat, and the specimen's own structure is taken for shading (measured on synthetic
sweeps: 6-16 % mean error, up to 33 % on a plane; basicpy 2.0.0 alike). The overlaps of
neighbouring tiles do not need that assumption: the same point of the specimen is seen at two
places of the sensor, so the ratio of the two readings is the ratio of the flatfield there,
whatever the specimen (Kask et al., J. Microsc. 263, 328 (2016), doi:10.1111/jmi.12404).

Flatfield (``refine_flatfield``), per plane, on the working-size tiles and the stitching
positions of the accepted pairs:

1. Overlap samples: each pixel of tile a in the overlap and the same point in tile b
   (bilinear), both with the additive term subtracted; log ratio r = log(a) - log(b).
2. Model: log F = the BaSiC flatfield projected on 2-D Legendre polynomials of total degree
   K, corrected by a polynomial of the same degree fitted to r (weighted by counts, robust
   against misregistered or moving objects), with a ridge toward BaSiC's projection where the
   overlaps say little (the middle of the tile is in no overlap).
3. K, the ridge and which additive term to subtract (the camera offset, or the envelope of the dim
   tiles, which holds sensor-fixed stray light) are chosen by 4-fold cross-validation over the pairs:
   the held-out pairs' median |r - model| in units of its shot noise decides. The envelope is taken
   only where it scores clearly better than the offset; then the simplest candidate within one
   standard error of the best.
4. A plane with too few overlap samples (its pairs rejected) keeps BaSiC's flatfield on the same model
   (``smooth_flatfield``): the texture BaSiC leaves finer than that is the specimen's.

Offset (``estimate_channel_offset``): the low envelope of the tiles (a low quantile per pixel, the
``darkfield`` BaSiC subtracts before its fit, of tiles averaged enough that its minimum is not the noise's:
``offset_envelope``) is the
camera offset plus the light the dimmest tiles still carry, and that light is modulated by the
flatfield. The offset is the envelope's lower support (quantile regression) after an F-shaped light
floor is taken out, free per column (the sensor's column pattern) and told from the floor along the
columns, then made affine (constant + gradient). Where every tile carries
light at every pixel (a dense stain, no bare slide) the two cannot be told apart well; when the
offset's standard error (resampled over planes and field) exceeds a tenth of that floor, it is
flagged so the user can give the offset (``basic.darkfield: {channel: <counts>}``). ``channel_offsets``
does all of it for every channel of a cycle, as the stitch stage does.

The additive term the output is corrected with is the one its flatfield was fitted with: where the overlaps
chose the envelope, the offset and what of the envelope lies above it and the light floor (``envelope_excess``:
light fixed to the sensor, such as stray light, and the specimen the dimmest tiles showed); else the offset.
Without overlaps BaSiC's flatfield, fitted with the envelope subtracted, is kept, and the excess is subtracted
where alternate halves of the tiles agree on it (``fixed_to_sensor``: stray light is the same in every tile, the
dimmest tiles' specimen is not; where they agree on it once the places one half still showed specimen are left
out, its broad part, ``_broad_part``); else the offset alone.
Real wsi_brain tiles carry stray light of up to ~550 counts in two corners.

Offset from the overlaps (``overlap_offset``): the two readings of one point of the specimen are
a = F(p_a) S + D(p_a) and b = F(p_b) S + D(p_b), so a - D(p_a) = rho (b - D(p_b)) with rho = F(p_a) / F(p_b)
whatever the point's brightness S. Over the points of an overlap, bright and dim, that holds for one
offset only: a wrong one makes the log ratio depend on S. This needs no dim tile at all (a dense stain is
where it is most informative: every point carries light); where the envelope's offset is not certain and there
are three planes or more, it is taken where its spread over the planes makes it clearly more certain
(``with_overlaps``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.polynomial import legendre
from scipy import ndimage

from .basic import estimate_darkfield
from .robust import robust_std

DEGREES = (2, 4, 6)              # candidate total degrees of the log-flatfield polynomial
RIDGES = (1.0, 1e-2, 1e-4, 1e-6)  # candidate pulls toward BaSiC's projection (per sample, weights mean 1)
FOLDS = 4
MIN_SAMPLES = 500                # fewer usable overlap samples: BaSiC's flatfield is kept
MAX_SAMPLES = 30000              # overlap samples used per plane (evenly thinned beyond)
ROBUST_C = 3.0                   # Cauchy weight scale, in robust stds of the residual
ENVELOPE_SIGMA = 6.0             # the low envelope smoothed further (working-size px): offsets are smooth, nuclei not
SUPPORT_QUANTILE = 0.05          # the offset model lies under this fraction of the envelope
CLEARLY_BETTER = 3.0             # standard errors by which a later additive term must score better to be taken
FAR_ABOVE = 5.0                  # the envelope's blocks above the support's median residual by more than this many
                                 # robust spreads are left out of it (_support_fit): light the model does not hold
FAR_ABOVE_ROUNDS = 10            # refits at most, until the blocks left out no longer change
SENSOR_FIXED_RELIABILITY = 0.9   # without overlaps, the envelope's excess is subtracted where at least this much of it
                                 # is the sensor's (fixed_to_sensor)
STRAY_DEGREE = 4                 # the broad part of an excess the halves agree on only in part: a polynomial of this
                                 # total degree (the middle of DEGREES), fitted robustly where they agree (_broad_part)
GRID = 32                        # the envelope is fitted on GRID x GRID block means


def _basis(y, x, degree: int) -> np.ndarray:
    """2-D Legendre polynomials P_i(y) P_j(x), i + j <= degree, at y, x in [-1, 1]; (n, terms),
    ordered by total degree (so the columns of a lower degree come first)."""
    cols = []
    for total in range(degree + 1):
        for i in range(total + 1):
            j = total - i
            cy = np.zeros(i + 1)
            cy[i] = 1
            cx = np.zeros(j + 1)
            cx[j] = 1
            cols.append(legendre.legval(y, cy) * legendre.legval(x, cx))
    return np.stack(cols, -1)


def _terms(degree: int) -> int:
    return (degree + 1) * (degree + 2) // 2


@dataclass(frozen=True)
class Refinement:
    """How a plane's flatfield was refined."""

    degree: int | None           # None: too few overlap samples, BaSiC's flatfield kept
    ridge: float
    additive: str                # "envelope" or "offset": what was subtracted before the ratios
    samples: int
    seam_before: float           # median |log ratio| of the overlaps with BaSiC's flatfield
    seam_after: float            # ... with the refined one


def overlap_samples(tiles: np.ndarray, additive: np.ndarray, pairs, scale, thin: int = MAX_SAMPLES,
                    above: np.ndarray | None = None):
    """(ya, xa, yb, xb, ca, cb, pair): working-size coordinates of each overlap sample in tile a and
    b, the two readings minus ``additive`` and the pair's index; at most about ``thin`` samples,
    every k-th of each pair's overlap (thinned before anything is copied: memory). ``pairs``:
    (a, b, (dy, dx)) with b's top-left relative to a's in full-resolution px; ``scale``: working
    size / tile size per axis. The samples kept: both readings above ``additive``, or above ``above``
    where given (the highest of several candidate additive terms: each is then scored on the same points)."""
    n, hs, wsx = tiles.shape
    yy, xx = np.mgrid[0:hs, 0:wsx].astype(np.float64)
    inner = (yy >= 1) & (yy <= hs - 2) & (xx >= 1) & (xx <= wsx - 2)   # the outermost working px averages
    where = []                                                          # across the tile's border
    for _a, _b, (dy, dx) in pairs:
        yb, xb = yy - dy * scale[0], xx - dx * scale[1]
        inside = inner & (yb >= 1) & (yb <= hs - 2) & (xb >= 1) & (xb <= wsx - 2)
        where.append(np.flatnonzero(inside))
    total = sum(len(w) for w in where)
    step = max(1, -(-total // thin))
    parts = []
    for k, ((a, b, (dy, dx)), idx) in enumerate(zip(pairs, where)):
        idx = idx[::step]
        if len(idx) < 4:
            continue
        ya, xa = yy.ravel()[idx], xx.ravel()[idx]
        yb, xb = ya - dy * scale[0], xa - dx * scale[1]
        ra, rb = tiles[a].ravel()[idx], ndimage.map_coordinates(tiles[b], [yb, xb], order=1)
        ca = ra - additive.ravel()[idx]
        cb = rb - ndimage.map_coordinates(additive, [yb, xb], order=1)
        ok = (ca > 0) & (cb > 0) if above is None else (
            (ra > above.ravel()[idx]) & (rb > ndimage.map_coordinates(above, [yb, xb], order=1)))
        parts.append(np.stack([ya[ok], xa[ok], yb[ok], xb[ok], ca[ok], cb[ok], np.full(int(ok.sum()), k)]))
    return np.concatenate(parts, axis=1) if parts else np.zeros((7, 0))


def _design(s: np.ndarray, shape, degree: int, subtracted=(0.0, 0.0)):
    """(design, log ratios, weights (mean 1), pair index, noise) of the overlap samples ``s``; noise: each log
    ratio's standard deviation from the shot noise (counts as photons: one scale for every candidate).
    ``subtracted``: the light taken off each reading with the additive term, above the camera's offset (at a, b):
    a reading's shot noise is that of all the light it held, the part subtracted included."""
    def norm(v, n):
        return 2 * v / (n - 1) - 1
    ya, xa, yb, xb, ca, cb, pair = s
    A = _basis(norm(ya, shape[0]), norm(xa, shape[1]), degree) - _basis(norm(yb, shape[0]), norm(xb, shape[1]), degree)
    r = np.log(ca) - np.log(cb)
    ea, eb = subtracted
    variance = (ca + ea) / ca ** 2 + (cb + eb) / cb ** 2
    w = 1.0 / variance
    return A[:, 1:], r, w / w.mean(), pair.astype(int), np.sqrt(variance)


def _weighted_solve(A, r, wt) -> np.ndarray:
    """Weighted least squares of r on A (a 1e-9 ridge per sample keeps an empty term at 0)."""
    Aw = A * wt[:, None]
    return np.linalg.solve(Aw.T @ A + 1e-9 * len(r) * np.eye(A.shape[1]), Aw.T @ r)


def _robust_weights(A, r, w, iterations: int = 3) -> np.ndarray:
    """Counts weights times Cauchy weights of the residual of a loose fit (misregistered or moving
    objects, dust on one tile only)."""
    wt = w.copy()
    for _ in range(iterations):
        c = _weighted_solve(A, r, wt)
        res = r - A @ c
        sig = robust_std(res, about_zero=True) + 1e-9
        wt = w / (1 + (res / (ROBUST_C * sig)) ** 2)
    return wt


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cw = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cw, 0.5 * cw[-1])])


class _Overlaps(NamedTuple):
    """A plane's overlap samples with one additive term subtracted, as the flatfield is fitted to them."""

    samples: np.ndarray          # overlap_samples
    design: np.ndarray           # the log-flatfield's basis at a less at b
    ratios: np.ndarray           # log ratios of the two readings
    weights: np.ndarray          # inverse shot-noise variance (mean 1) times Cauchy weights (_robust_weights)
    pair: np.ndarray             # each sample's pair index
    noise: np.ndarray            # each log ratio's shot-noise standard deviation (_design)
    robust: np.ndarray           # the Cauchy weights alone


def _cv_candidates(d: _Overlaps, prior, degrees, ridges, in_noise: bool = True):
    """[(mean held-out score, its standard error, degree, ridge, mean score in the noise, its standard error)]
    for every candidate (``in_noise`` false: those two nan, not computed -- one additive term, nothing to
    choose between; a weighted median per fold and candidate is host time while the job holds its GPU).

    The score: the held-out samples' weighted median |r - model| (log units; it chooses the degree and ridge).
    In the noise: their median |r - model| in units of each sample's shot noise (Cauchy-weighted; it chooses
    the additive term, ``refine_flatfield``): additive terms compared in one currency, since subtracting more
    leaves a dimmer reading whose log ratio is noisier, with the same photons. (In log units, a sparse
    marker's overlaps -- background, mostly -- read closer the less was subtracted, and a flatfield of degree
    6 bent to hold 135 counts of stray light in one corner scored better than the truth: plex_bias's stray
    regime, 15 % flatfield error, +27 counts.)"""
    A, r, wt, pair = d.design, d.ratios, d.weights, d.pair
    fold = pair % FOLDS
    out = []
    grams = []
    for k in range(FOLDS):
        tr = fold != k
        Aw = A[tr] * wt[tr, None]
        grams.append((Aw.T @ A[tr], Aw.T @ r[tr], int(tr.sum())))
    for degree in degrees:
        m = _terms(degree) - 1
        for ridge in ridges:
            scores, noise_scores = [], []
            for k in range(FOLDS):
                G, g, n = grams[k]
                held = fold == k
                if not held.any():
                    continue
                reg = ridge * n * np.eye(m)
                c = np.linalg.solve(G[:m, :m] + reg, g[:m] + reg @ prior[:m])
                res = np.abs(r[held] - A[held, :m] @ c)
                scores.append(_weighted_median(res, wt[held]))
                if in_noise:
                    noise_scores.append(_weighted_median(res / d.noise[held], d.robust[held]))
            noise = (float(np.mean(noise_scores)), float(np.std(noise_scores) / np.sqrt(len(noise_scores)))) \
                if in_noise else (float("nan"), float("nan"))
            out.append((float(np.mean(scores)), float(np.std(scores) / np.sqrt(len(scores))), degree, ridge) + noise)
    return out


def _overlap_design(tiles, additive, pairs, scale, shape, camera=None, above=None) -> _Overlaps | None:
    """The overlap samples with ``additive`` subtracted, as fitted (``_Overlaps``), or None with too few samples.
    ``camera``: the camera's offset where known: what ``additive`` holds above it is light, whose shot noise the
    readings keep; ``above``: as ``overlap_samples``."""
    s = overlap_samples(tiles, additive, pairs, scale, above=above)
    if s.shape[1] < MIN_SAMPLES:
        return None
    subtracted = (0.0, 0.0)
    if camera is not None:
        light = np.maximum(np.asarray(additive, np.float64) - camera, 0)
        subtracted = tuple(ndimage.map_coordinates(light, [s[i], s[i + 1]], order=1) for i in (0, 2))
    A, r, w, pair, noise = _design(s, shape, max(DEGREES), subtracted)
    wt = _robust_weights(A, r, w)
    return _Overlaps(s, A, r, wt, pair, noise, wt / w)


def _seam(s: np.ndarray, r: np.ndarray, wt: np.ndarray, flat: np.ndarray) -> float:
    """Median |log ratio| of the overlap samples left after correcting both readings by ``flat``."""
    ya, xa, yb, xb = s[:4]
    lf = np.log(np.maximum(flat, 1e-6))
    model = ndimage.map_coordinates(lf, [ya, xa], order=1) - ndimage.map_coordinates(lf, [yb, xb], order=1)
    return _weighted_median(np.abs(r - model), wt)


def _projection(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(basis, coefficients): log ``flat`` projected on the flatfield model (2-D Legendre polynomials of total
    degree max(DEGREES) on the working grid)."""
    shape = flat.shape
    yy, xx = np.mgrid[0:shape[0], 0:shape[1]].astype(np.float64)
    B = _basis(2 * yy.ravel() / (shape[0] - 1) - 1, 2 * xx.ravel() / (shape[1] - 1) - 1, max(DEGREES))
    return B, np.linalg.lstsq(B, np.log(np.maximum(flat, 1e-6)).ravel(), rcond=None)[0]


def smooth_flatfield(flat: np.ndarray) -> np.ndarray:
    """BaSiC's flatfield on the model a refined one has (log-Legendre, total degree max(DEGREES)), mean 1: the
    optics shade the field smoothly, and what BaSiC leaves finer than that is the specimen's own texture,
    which a few tens of tiles do not average out (40 fields without overlaps, bench/basic_alone.py: dense
    nuclei 13.0 -> 8.5 % RMS against the truth, and the offset fitted under it +17.9 -> +9.5 counts)."""
    B, c = _projection(flat)
    return _flat_of(B @ c, flat.shape)


def _flat_of(log_f: np.ndarray, shape) -> np.ndarray:
    """The flatfield (mean 1, float32) of a log-flatfield evaluated on the working grid."""
    f = np.exp(log_f).reshape(shape)
    return (f / f.mean()).astype(np.float32)


def refine_flatfield(tiles: np.ndarray, basic_flat: np.ndarray, additives: dict, pairs, scale,
                     camera: np.ndarray | None = None) -> tuple:
    """The plane's flatfield (working size, mean 1) refined on the overlaps; see the module doc.

    ``tiles``: (N, ws, ws) working-size tiles (host); ``basic_flat``: BaSiC's flatfield (ws, ws);
    ``additives``: {"offset": .., "envelope": ..} candidate additive terms (ws, ws), the simplest first: a later
    one is taken only where its best score is below the one taken so far by CLEARLY_BETTER combined standard
    errors (the envelope's excess over the camera, ``envelope_excess``, is then subtracted from the output too:
    stray light it is, where the overlaps need it; a dense stain's dimmest tiles' specimen it would be, where
    they do not); ``camera``: the camera's offset where known. What a candidate subtracts above
    the camera is light, and its shot noise stays in the readings: the log ratios are weighted and scored by
    it (``_design``, ``_cv_candidates``). Returns (flatfield, Refinement)."""
    shape = basic_flat.shape
    B, coeffs = _projection(basic_flat)
    prior = coeffs[1:]                                           # BaSiC's shape, as polynomial coefficients
    # every candidate on the same points, those above all of them: a reading the envelope leaves barely above 0
    # is kept only where its noise happened to be high (a Blank marker's plane took the envelope so, 10 % wrong)
    above = np.maximum.reduce([np.asarray(a, np.float64) for a in additives.values()]) if len(additives) > 1 \
        else None
    designs, scored = {}, {}
    for name, add in additives.items():       # kept for the fit: two of ~7 MB (30000 samples x 28 terms)
        design = _overlap_design(tiles, add, pairs, scale, shape, camera, above)
        if design is not None:
            designs[name] = design
            scored[name] = _cv_candidates(design, prior, DEGREES, RIDGES, in_noise=len(additives) > 1)
    if not scored:
        # no overlaps: BaSiC on the model (smooth_flatfield, its projection already made)
        return _flat_of(B @ coeffs, shape), Refinement(None, 0.0, "", 0, float("nan"), float("nan"))
    name = next(iter(scored))
    for other in scored:                                         # a later additive term: only where clearly better
        mine, theirs = (min(c[4:6] for c in scored[n]) for n in (name, other))
        if theirs[0] < mine[0] - CLEARLY_BETTER * np.hypot(mine[1], theirs[1]):
            name = other
    best = min(scored[name])
    # the simplest within one standard error of the best: lowest degree, strongest pull to BaSiC
    degree, ridge = min((c for c in scored[name] if c[0] <= best[0] + best[1]), key=lambda c: (c[2], -c[3]))[2:4]
    s, A, r, wt = designs[name][:4]
    m = _terms(degree) - 1
    reg = ridge * len(r) * np.eye(m)
    Aw = A[:, :m] * wt[:, None]
    c = np.linalg.solve(Aw.T @ A[:, :m] + reg, Aw.T @ r + reg @ prior[:m])
    flat = _flat_of(B[:, 1:m + 1] @ c, shape)
    return flat, Refinement(degree, ridge, name, len(r), _seam(s, r, wt, basic_flat),
                                               _seam(s, r, wt, flat))


def _quantile_fit(A: np.ndarray, b: np.ndarray, tau: float, iterations: int = 60, tolerance: float = 1e-2,
                  start: np.ndarray | None = None) -> np.ndarray:
    """Linear quantile regression (the tau-th quantile of b given A) by iteratively reweighted LS, until no
    coefficient moves by ``tolerance`` (counts, or counts per unit of its regressor). ``start``: where the
    iterations begin (a fit of nearly the same data: a resample), default the least-squares fit.

    0.01 count: on 20 captured channel fits the offsets moved by at most 0.19 counts (typically < 0.03)
    against 0.001, every model choice and flag the same, in 45 % less time (the offset is fitted ~50 times a
    channel to resample it, on the host while the job holds its GPU)."""
    def weighted_ls(w):             # on the normal equations: few columns, many rows; lstsq's minimum-norm
        Aw = A * w[:, None]          # answer (pinv(A'WA) A'Wb = pinv(W^1/2 A) W^1/2 b): a flat regressor is no error
        return np.linalg.lstsq(Aw.T @ A, Aw.T @ b, rcond=None)[0]
    c = weighted_ls(np.ones(len(b)))
    eps = 1e-3 * (float(np.abs(b - A @ c).mean()) + 1e-12)
    if start is not None:
        c = start
    for _ in range(iterations):
        res = b - A @ c
        c, before = weighted_ls(np.where(res >= 0, tau, 1 - tau) / np.maximum(np.abs(res), eps)), c
        if np.abs(c - before).max() < tolerance:
            break
    return c


def _offset_image(off, shape) -> np.ndarray:
    """The affine offset (c0, cy, cx) on the working grid (y, x in [0, 1] from pixel 0 to the last)."""
    h, w = shape
    Y, X = np.mgrid[0:h, 0:w] / np.array([max(h - 1, 1), max(w - 1, 1)])[:, None, None]
    return np.maximum(off[0] + off[1] * Y + off[2] * X, 0).astype(np.float32)


def _envelope_blocks(envelope: np.ndarray, flat: np.ndarray):
    """The smoothed envelope and the flatfield as GRID x GRID block means, and the blocks' centres (y, x)
    in the image's [0, 1] coordinates (pixel 0 to pixel h - 1, as the offset image is evaluated).

    The smoothing (nuclei out, the offset is smooth) is applied to what an affine plane does not explain,
    the plane added back: smoothed whole, the camera's gradient bends at the borders (padding holds the
    edge value) and the lower support follows the bend (an exactly affine offset came out 2 counts low
    with a light floor of 1.6 counts that is not there)."""
    envelope = np.asarray(envelope, np.float64)
    h, w = envelope.shape
    Y, X = np.mgrid[0:h, 0:w]
    A = np.stack([np.ones(h * w), Y.ravel(), X.ravel()], 1)
    plane = (A @ np.linalg.lstsq(A, envelope.ravel(), rcond=None)[0]).reshape(h, w)
    envelope = plane + ndimage.gaussian_filter(envelope - plane, ENVELOPE_SIGMA, mode="nearest")
    fy, fx = max(1, h // GRID), max(1, w // GRID)
    gy, gx = h // fy, w // fx
    def blocks(a):
        return a[:gy * fy, :gx * fx].reshape(gy, fy, gx, fx).mean(axis=(1, 3))
    cy = ((np.arange(gy) + 0.5) * fy - 0.5) / max(h - 1, 1)
    cx = ((np.arange(gx) + 0.5) * fx - 0.5) / max(w - 1, 1)
    yy, xx = np.meshgrid(cy, cx, indexing="ij")
    return blocks(envelope), blocks(np.asarray(flat, np.float64)), yy.ravel(), xx.ravel()


@dataclass(frozen=True)
class ChannelOffset:
    """One camera offset for every z-plane of a channel (the offset belongs to the camera, not to a
    plane), from all its planes' envelopes at once."""

    image: np.ndarray            # (ws, ws) affine offset, shared by every plane
    light_floor: float           # light the dimmest plane's envelope holds above it (mean counts)
    uncertainty: float           # standard error of the offset's mean (counts): over the planes and over the field
    per_plane: tuple[float, ...]  # each plane's own estimate (the same model on it alone): diagnostics only
    uncertain: bool              # uncertainty clearly above (_clearly_above) UNCERTAIN_OF_FLOOR of the light floor
                                 # (and MIN_UNCERTAINTY); fewer than 3 planes: or the floor above UNCERTAIN_FLOOR of
                                 # the offset
    per_column: bool = True      # the lower support fitted free per sensor column (else affine): where clearly
                                 # more certain (_per_column_clearly_more_certain)
    from_overlaps: bool = False  # from the tile overlaps (overlap_offset), not the envelope: clearly more certain

    @property
    def model(self) -> str:
        """The estimate's model by name (job log, planes.json)."""
        return "overlaps" if self.from_overlaps else "per column" if self.per_column else "affine"


UNCERTAIN_OF_FLOOR = 0.1         # the offset is uncertain when its standard error clearly exceeds (_clearly_above)
MIN_UNCERTAINTY = 2.0            # this fraction of the dimmest plane's light floor, and this many counts
UNCERTAIN_FLOOR = 0.5            # with fewer than 3 planes (not resampled over planes): also uncertain when the
                                 # light floor exceeds this fraction of the offset (one plane, synthetic sweep:
                                 # floor/offset < 0.5 -> offset within 10 %; 0.65-15 -> 4-160 %)
SUPER_BLOCKS = 4                 # the field resampled as SUPER_BLOCKS x SUPER_BLOCKS regions ...
BOOTSTRAP = 20                   # ... this many times (seeded: the same data give the same answer)
JACKKNIFE_GROUPS = 5             # the planes left out in turn one at a time, or in this many interleaved groups
                                 # (every 5th plane: each group spans the stack) where there are more planes
                                 # (delete-a-group jackknife: 20 planes cost 10 fits, not 40; 11.1 -> 7.7 s a channel)


class _Support(NamedTuple):
    """The lower support ``_joint_fit`` found."""

    offset: np.ndarray           # affine (c0, cy, cx)
    light: np.ndarray            # m_z per plane kept
    coefficients: np.ndarray     # the fit's own: per column intercepts (or c0, cx), cy, m_z: a resample's start
    far: np.ndarray              # (planes, blocks) the blocks left out of the fit, far above it (_support_fit)


def _joint_fit(parts, keep, blocks=None, per_column: bool = True, start: np.ndarray | None = None,
               far: np.ndarray | None = None) -> _Support:
    """Shared offset and a light level m_z >= 0 per plane, the SUPPORT_QUANTILE lower support of the planes
    ``keep`` together: envelope_z(y, x) = o(x) + cy y + m_z flatfield_z(y, x), with a free o per column of
    blocks. Returns the affine offset (c0, cy, cx): the line through the o's, and the m_z. ``blocks``: the
    block indices used (repeats allowed), default all; ``start``: the coefficients of a fit of nearly the
    same data (the full data, for a resample of it), where the iterations begin; ``far``: (len(keep), blocks) the
    blocks to leave out (those a fit of the full data left out, for a resample of it), default found here
    (``_support_fit``: far above the affine fit; the per-column one leaves none out).

    Free per column because the camera's fixed pattern is per column (an sCMOS sensor reads each column
    through its own amplifier): what ``defects.column_offsets`` leaves of it (its slow part, below
    COLUMN_SMOOTH, and what the specimen hid) is a profile across x, the same on every row, plane and
    tile. An affine offset cannot follow it, and the lower support then leans on the flatfield instead:
    the fit takes the residue for an F-shaped light floor and the offset comes out low by as much (450
    counts with a +-2 % pattern, plex_bias's ramp on 3 seeds: a light floor of 2-11 counts that is not
    there and the offset 6-14 counts low; per column 1.9-2.5 low, no floor). The light floor is then told
    from the offset by how the flatfield varies along each column (the optics' dome is two-dimensional,
    the pattern is not); the offset's gradient across x is the line through the columns' values.
    ``per_column`` false: one affine offset (c0 + cy y + cx x), the model that needs the least evidence."""
    columns = np.unique(parts[keep[0]][3]) if per_column else np.zeros(1)
    rows, b, left_out = [], [], []
    for j, k in enumerate(keep):
        L, F, yy, xx = parts[k]
        sel = np.arange(L.size) if blocks is None else blocks
        intercept = np.zeros((sel.size, columns.size))
        intercept[np.arange(sel.size), np.searchsorted(columns, xx[sel]) if per_column else 0] = 1
        m = np.zeros((sel.size, len(keep)))
        m[:, j] = F.ravel()[sel]
        slopes = yy[sel][:, None] if per_column else np.stack([yy[sel], xx[sel]], 1)
        rows.append(np.hstack([intercept, slopes, m]))
        b.append(L.ravel()[sel])
        left_out.append(np.zeros(sel.size, bool) if far is None else far[j][sel])
    A, b, left_out = np.vstack(rows), np.concatenate(b), np.concatenate(left_out)
    n_offset = columns.size + (1 if per_column else 2)
    present = np.concatenate([A[~left_out, :columns.size].any(axis=0), [True] * (n_offset - columns.size + len(keep))])
    free = present.copy()
    for _ in range(len(keep) + 1):                 # light cannot be negative: such a plane's light term is 0
        c = np.zeros(A.shape[1])
        c[free], left_out = _support_fit(A[:, free], b, None if start is None else start[free], left_out,
                                         find=far is None and not per_column)      # see _support_fit
        negative = free & (c < 0)
        negative[:n_offset] = False
        if not negative.any():
            break
        free &= ~negative
    if far is None and blocks is None:
        far = left_out.reshape(len(keep), -1)
    if not per_column:
        return _Support(c[:3], c[3:], c, far)
    seen = present[:columns.size]
    cx, c0 = np.polyfit(columns[seen], c[:columns.size][seen], 1) if seen.sum() > 1 else (0.0, c[:columns.size][seen][0])
    return _Support(np.array([c0, c[columns.size], cx]), c[n_offset:], c, far)


def _support_fit(A: np.ndarray, b: np.ndarray, start: np.ndarray | None, left_out: np.ndarray,
                 *, find: bool) -> tuple[np.ndarray, np.ndarray]:
    """The SUPPORT_QUANTILE lower support of b given A (``_quantile_fit``), the blocks far above it left out: a
    residual above the residuals' median by more than FAR_ABOVE robust spreads (1.4826 MAD) is light the model
    (offset plus a light floor under the flatfield) does not hold -- stray light fixed to the sensor, glare --
    and is refitted without, until the blocks left out no longer change. A column of A keeps its blocks where
    leaving them out would leave it none (a plane's light term: its light still has data).

    Why: in a quantile fit every point above the support pulls it up (by SUPPORT_QUANTILE each), however far
    above. Light in one corner pulls the support up into that corner and, the light floor taking the
    difference, down elsewhere. plex_bias's stray regime (135-150 counts of unshaded light in one corner): on
    the stage's own envelopes the offset came out 12.0-13.0 counts low, now 4.8-5.8 -- what the same fit gives
    with the true light taken out of the envelopes (6.0); on noise-free ones (an affine offset, the light, a
    floor of 5) 9.2 low with a floor of 16.2, now 4.4 and 10.2.

    The affine fit only (``_joint_fit``): the per-column one keeps every block. Its intercepts are free per
    sensor column, and a column's lower blocks left out take away what tells its intercept from the light
    floor (the flatfield's dome along the column). On the real wsi_brain tiles (one plane, stray light in two
    corners), with the corners left out, the per-column fit's bootstrap error fell below the affine one's
    (35.2 against 62.1 counts) while its offset stayed 90 counts above it, 772 against the raw 1st percentile
    771; taken, the stage's overlaps read 2.79 % apart, with the affine 681 counts 2.57 % (2.58 before).
    Where the per-column model is chosen (plex_bias's sparse, dim and ramp regimes) the offset is as before.

    ``left_out``: the rows to leave out from the start; ``find`` false: those and no others (a resample of data
    whose blocks far above are known: one fit, not the rounds). Returns the coefficients and the rows left out."""
    kept = ~left_out
    c = _quantile_fit(*((A[kept], b[kept]) if left_out.any() else (A, b)), SUPPORT_QUANTILE, start=start)
    if not find:
        return c, left_out
    used = A != 0
    for _ in range(FAR_ABOVE_ROUNDS):
        r = b - A @ c
        middle = float(np.median(r[kept]))
        spread = robust_std(r[kept])
        now = r <= middle + FAR_ABOVE * spread
        bare = used[kept].any(axis=0) & ~used[now].any(axis=0)
        now |= used[:, bare].any(axis=1)
        if np.array_equal(now, kept):
            break
        kept = now
        c = _quantile_fit(A[kept], b[kept], SUPPORT_QUANTILE, start=c)
    return c, ~kept


def _super_blocks(n_blocks: int) -> list[np.ndarray]:
    """The GRID x GRID block indices grouped into SUPER_BLOCKS x SUPER_BLOCKS regions of the field."""
    g = int(round(np.sqrt(n_blocks)))
    r = np.arange(g) * SUPER_BLOCKS // g
    region = (r[:, None] * SUPER_BLOCKS + r[None, :]).ravel()
    return [np.flatnonzero(region == k) for k in range(SUPER_BLOCKS ** 2)]


NOISE_AVERAGED = 50.0           # raw pixels each reading averages before the offset's envelope takes its minimum


def offset_envelope(tiles: np.ndarray, scale) -> np.ndarray:
    """The low envelope the offset is fitted to (``estimate_channel_offset``): BaSiC's darkfield
    (``basic.estimate_darkfield``, a low quantile per pixel over the tiles, smoothed) of the working-size
    ``tiles`` (N, ws, ws), each first smoothed so that a reading averages NOISE_AVERAGED raw pixels (``scale``:
    working size over the tile's size, per axis; a working pixel already averages 1 / (scale_y scale_x)).

    The minimum of N noisy readings lies below their mean by about 1.9 of the noise's standard deviation
    (N = 20), and with Poisson noise that deviation grows with the light (as sqrt(read^2 + F S)): the
    support fit, offset + m F, takes the part of that depth which follows the flatfield F as less light
    floor and the rest, which does not vanish where F does, as a lower offset. Measured on plex_bias's
    sparse, dim and ramp regimes (128 x 160 tiles, a working pixel averages 1.25 raw ones): the offset 4.1-6.0
    counts low from the envelope of the noisy tiles, -0.1 to -0.4 from that of the noise-free ones; with 50
    raw pixels averaged first, 1.1-1.7 low. Tiles of 2048 px (256 raw pixels to a working one) are averaged
    enough already and are not smoothed."""
    pixels = 1.0 / (scale[0] * scale[1])
    sigma = np.sqrt(NOISE_AVERAGED / (4 * np.pi * pixels)) if pixels < NOISE_AVERAGED else 0.0
    tiles = np.asarray(tiles, np.float32)
    if sigma > 0:                               # a Gaussian of sigma averages 4 pi sigma^2 pixels' noise
        tiles = ndimage.gaussian_filter(tiles, (0, sigma, sigma), mode="nearest")
    return np.asarray(estimate_darkfield(tiles[None])[0], np.float64)


def estimate_channel_offset(envelopes: list[np.ndarray], flats: list[np.ndarray]) -> ChannelOffset:
    """The camera offset of one channel from the low envelopes and (first) flatfields of all its
    planes: per plane the envelope is the offset plus that plane's light floor times its flatfield;
    the offset is shared, so every plane's light pins it down together (the flatfield moves between
    planes while the offset stays).

    Its standard error over the planes (jackknife, JACKKNIFE_GROUPS) and over the field (bootstrap of its regions): a
    camera's offset is not exactly affine (column offsets, a fixed pattern), and where its residue
    happens to follow the flatfield's dome the fit takes it for light and moves the offset by as much
    (measured: a bare-slide field, offset 484 counts with a +-2 % column pattern, gave a light floor of
    9 counts that is not there and an offset 11 counts low); the planes share the camera, so only
    resampling the field shows it, and the offset is then flagged uncertain. (The column offsets are
    now measured and taken out of the envelopes first, ``defects.column_offsets``, and what of them is
    left is fitted per column, ``_joint_fit``; any other fixed pattern is what this guards against.)

    Where this is not certain (a dense stain, no tile dim anywhere), ``with_overlaps`` may do better."""
    parts = [_envelope_blocks(e, f) for e, f in zip(envelopes, flats)]
    n = len(parts)
    shape = envelopes[0].shape
    flat_means = np.array([p[1].mean() for p in parts])

    def offset_mean(o):
        return float(_offset_image(o, shape).mean())

    rng = np.random.default_rng(0)
    regions = _super_blocks(parts[0][0].size)
    draws = [np.concatenate([regions[k] for k in rng.integers(len(regions), size=len(regions))])
             for _ in range(BOOTSTRAP)]

    def resampled(per_column: bool) -> _Resampled:   # each resample starts from the full fit (fewer iterations),
                                                       # the blocks it left out left out
        full = _joint_fit(parts, list(range(n)), per_column=per_column)
        n_offset = full.coefficients.size - n
        field = float(np.std([offset_mean(_joint_fit(parts, list(range(n)), d, per_column, full.coefficients,
                                                     full.far).offset) for d in draws]))
        if n < 3:                             # too few planes to resample: the field's error alone
            return _Resampled(full, field)
        groups = [np.arange(g, n, min(n, JACKKNIFE_GROUPS)) for g in range(min(n, JACKKNIFE_GROUPS))]
        loo = np.array([offset_mean(_joint_fit(parts, [i for i in range(n) if i not in g], None, per_column,
                                               np.delete(full.coefficients, n_offset + g),
                                               np.delete(full.far, g, axis=0)).offset) for g in groups])
        planes = float(np.sqrt((len(groups) - 1) / len(groups) * np.sum((loo - loo.mean()) ** 2)))
        return _Resampled(full, float(np.hypot(planes, field)))

    fits = {per_column: resampled(per_column) for per_column in (True, False)}
    per_column = _per_column_clearly_more_certain(fits[True], fits[False])
    (off, light, _, far), se = fits[per_column]
    floor = float(min(m * fm for m, fm in zip(light, flat_means)))
    per_plane = tuple(offset_mean(_joint_fit([p], [0], per_column=per_column, far=far[[k]]).offset)
                      for k, p in enumerate(parts))
    image = _offset_image(off, shape)
    uncertain = _clearly_above(se, BOOTSTRAP, max(UNCERTAIN_OF_FLOOR * floor, MIN_UNCERTAINTY)) or (
        n < 3 and floor > UNCERTAIN_FLOOR * float(image.mean()))   # the field alone does not see a dense stain
    return ChannelOffset(image, floor, se, per_plane, uncertain, per_column)


def overlaps_may_help(offset: ChannelOffset, planes: int) -> bool:
    """Whether a channel's offset from the envelope is worth asking the overlaps about: it is not within
    MIN_UNCERTAINTY (below which an offset counts as certain anyway), and there are 3 planes or more to judge
    the overlaps' answer by (``with_overlaps``)."""
    return offset.uncertainty > MIN_UNCERTAINTY and planes >= 3


def with_overlaps(offset: ChannelOffset, envelopes: list[np.ndarray],
                  per_plane: list[np.ndarray | None]) -> ChannelOffset:
    """The channel's offset from its planes' overlaps (``overlap_offset`` each) where that is clearly more
    certain than ``offset`` (the envelope's, ``estimate_channel_offset``; the rule the per-column / affine
    choice uses, the overlaps' error being a spread over the planes); else ``offset``."""
    overlaps = _from_overlaps(envelopes, per_plane)
    if overlaps is not None and _clearly_more_certain(overlaps.uncertainty, len(envelopes), offset.uncertainty):
        return overlaps
    return offset


def channel_offsets(channels: dict, inputs, pairs, scale, map=map, envelope=None) -> tuple[dict, dict]:
    """One camera offset per channel from all its planes at once, as the stitch stage fits it (``channels``:
    {channel: plane keys}; ``inputs(key)``: a plane's working-size host tiles, BaSiC flatfield and envelope;
    ``envelope(key)``: the envelope alone, where that is cheaper than all three; ``map``: a pool's map runs the
    planes, then the channels, side by side): each plane's first flatfield (its envelope subtracted,
    ``first_flatfield``) and the envelope the offset is fitted to (``offset_envelope``: of tiles averaged
    enough), then ``estimate_channel_offset`` per channel; where a channel's offset is not certain, its planes'
    overlaps are asked (``with_overlaps``). Returns the offsets, {channel: ChannelOffset}, and the envelope
    each plane's offset was fitted to, {key: array} (its excess is ``shade_with_offset``'s ``low``)."""
    envelope = envelope or (lambda key: inputs(key)[2])
    planes = [key for ch in channels for key in channels[ch]]

    def first_and_low(key):                 # one copy of the plane's inputs to the host for both
        tiles, basic_flat, env = inputs(key)
        return first_flatfield(tiles, basic_flat, env, pairs, scale), offset_envelope(tiles, scale)
    both = dict(zip(planes, map(first_and_low, planes)))
    firsts, lows = {k: v[0] for k, v in both.items()}, {k: v[1] for k, v in both.items()}
    offsets = dict(zip(channels, map(lambda ch: estimate_channel_offset(
        [lows[k] for k in channels[ch]], [firsts[k] for k in channels[ch]]), channels)))
    ask = [ch for ch, off in offsets.items() if overlaps_may_help(off, len(channels[ch]))]
    if ask:              # the envelope cannot pin it (a dense stain): the planes' overlaps

        def from_overlaps(key):
            tiles, _, env = inputs(key)
            return overlap_offset(tiles, env, pairs, scale)
        ask_planes = [key for ch in ask for key in channels[ch]]
        found = dict(zip(ask_planes, map(from_overlaps, ask_planes)))
        for ch in ask:
            offsets[ch] = with_overlaps(offsets[ch], [envelope(k) for k in channels[ch]],
                                        [found[k] for k in channels[ch]])
    return offsets, lows


def _from_overlaps(envelopes: list[np.ndarray], per_plane: list[np.ndarray | None]) -> ChannelOffset | None:
    """The channel's offset from its planes' overlaps (``overlap_offset`` per plane: two ends each): the mean
    of the planes' affine offsets (each the middle of its two ends); its standard error one plane's spread
    (not divided by sqrt(planes): the planes image the same specimen through the same overlaps, so their
    errors are largely shared -- a Blank cycle's autofluorescence gave -36..-11 counts on 5 planes, all low)
    and half the ends' mean distance apart (what the overlaps left undecided); None with fewer than 3
    planes measured (no spread to judge it by), and None where an end is no offset at all: below 0 somewhere
    on the sensor, or above what the plane's dimmest tiles read (its envelope, on average). Such an answer means the
    overlaps' model did not hold (measured: stray light of up to 150 counts in one corner, added and not
    affine, drove every plane's ends below 0; clipped to 0 they agreed exactly, a standard error of 0, and
    were taken: the offset 0 for a camera at 90-100 counts)."""
    if len(per_plane) != len(envelopes) or any(g is None for g in per_plane) or len(per_plane) < 3:
        return None
    shape = envelopes[0].shape
    for plane, envelope in zip(per_plane, envelopes):
        for g in plane:
            corners = g[0] + np.array([0.0, g[1], g[2], g[1] + g[2]])      # an affine image's extremes
            if corners.min() < 0 or float(_offset_image(g, shape).mean()) > float(np.mean(envelope)):
                return None
    ends = np.array([[float(_offset_image(g, shape).mean()) for g in plane] for plane in per_plane])
    means = ends.mean(axis=1)
    image = _offset_image(np.mean([plane.mean(axis=0) for plane in per_plane], axis=0), shape)
    se = float(np.hypot(np.std(means, ddof=1), np.abs(ends[:, 1] - ends[:, 0]).mean() / 2))
    floor = max(0.0, min(float(np.mean(e - image)) for e in envelopes))
    return ChannelOffset(image, floor, se, tuple(means), se > max(UNCERTAIN_OF_FLOOR * floor, MIN_UNCERTAINTY),
                         per_column=False, from_overlaps=True)


class _Resampled(NamedTuple):
    """A lower support and the standard error of its offset's mean: over the planes (jackknife, where there
    are 3 or more) and over the field (bootstrap of its regions)."""

    support: _Support
    error: float


def _per_column_clearly_more_certain(per_column: _Resampled, affine: _Resampled) -> bool:
    """The offset model: the simpler (affine) unless the per-column one's error is smaller by more than an
    error's own sampling error (a standard deviation from BOOTSTRAP draws is uncertain by
    1 / sqrt(2 (BOOTSTRAP - 1)) of itself), as the flatfield's degree is chosen. Found on the real
    wsi_brain tiles (one plane): per column 795 counts, above the raw 1st percentile 771, with an error
    (55.7) no smaller than the affine fit's (60.3, 684 counts)."""
    return _clearly_more_certain(per_column.error, BOOTSTRAP, affine.error)


def _clearly_above(error: float, draws: int, threshold: float) -> bool:
    """``error`` (a standard deviation from ``draws`` values) above ``threshold`` by more than its own sampling
    error: what flags an offset uncertain. A standard error from BOOTSTRAP draws is itself uncertain by 16 %:
    at the threshold, the flag would follow the draws, not the data (the workflow test's clean data, 128 x 128
    tiles, one cycle: 2.1 counts against MIN_UNCERTAINTY, the other cycles 1.0 and 1.4)."""
    return bool(error * (1 - 1 / np.sqrt(2 * (draws - 1))) > threshold)   # a Python bool: planes.json


def _clearly_more_certain(error: float, draws: int, other: float) -> bool:
    """``error`` (a standard deviation from ``draws`` values) smaller than ``other`` by more than its own
    sampling error (1 / sqrt(2 (draws - 1)) of itself)."""
    return error * (1 + 1 / np.sqrt(2 * (draws - 1))) < other


OVERLAP_ITERATIONS = 100        # alternations of the flatfield's ratio and the offset (9-22 per start on the sweeps)
OVERLAP_TOLERANCE = 0.05        # counts: the alternation stops when no offset coefficient moves by more


def overlap_offset(tiles: np.ndarray, envelope: np.ndarray, pairs, scale) -> np.ndarray | None:
    """A plane's affine camera offset (c0, cy, cx, as ``_offset_image``) from its tile overlaps (see the module
    doc), fitted from below and from above: (2, 3), the two ends; None with too few overlap samples.
    ``tiles``: (N, ws, ws) working-size tiles (host), offset not subtracted; ``envelope``: their low envelope
    (offset plus the dimmest light: the offset lies under its 1st percentile, the start from above; half
    of it the start from below). Where the overlaps pin the offset both ends land on it; where they do not
    (a specimen without contrast: each point's brightness nearly the same), the alternation stalls near
    where it began and the ends stay apart, which the channel's standard error then shows (_from_overlaps).

    Alternates two weighted least-squares fits: the log ratio of the two readings, each less the offset,
    on the flatfield's model (2-D Legendre polynomials of total degree max(DEGREES), as the flatfield is
    refined) plus one constant per pair (the two exposures of an overlap differ: lamp, bleaching); then the
    offset from a - rho b = D(p_a) - rho D(p_b) in counts, weighted by the inverse Poisson variance of the
    left side (a + rho^2 b). Both fits robust (Cauchy weights)."""
    shape = tiles.shape[1:]
    s = overlap_samples(tiles, np.zeros(shape), pairs, scale)
    if s.shape[1] < MIN_SAMPLES:
        return None
    ya, xa, yb, xb, ca, cb, pair = s

    def norm(v, n):
        return 2 * v / (n - 1) - 1
    pairs_of = (pair.astype(int)[:, None] == np.unique(pair.astype(int))[None, :]).astype(np.float64)
    A = np.hstack([(_basis(norm(ya, shape[0]), norm(xa, shape[1]), max(DEGREES))
                    - _basis(norm(yb, shape[0]), norm(xb, shape[1]), max(DEGREES)))[:, 1:], pairs_of])
    ua = np.stack([np.ones_like(ya), ya / (shape[0] - 1), xa / (shape[1] - 1)], 1)
    ub = np.stack([np.ones_like(yb), yb / (shape[0] - 1), xb / (shape[1] - 1)], 1)
    top = float(np.percentile(envelope, 1))
    ends = [_alternate(A, ua, ub, ca, cb, np.array([start, 0.0, 0.0])) for start in (top / 2, top)]
    return None if any(e is None for e in ends) else np.stack(ends)


def _alternate(A, ua, ub, ca, cb, g: np.ndarray) -> np.ndarray | None:
    """overlap_offset's alternation from the offset ``g``; None where the offset leaves fewer than MIN_SAMPLES
    readings above it."""
    c = step = plain = None
    for _ in range(OVERLAP_ITERATIONS):
        a, b = ca - ua @ g, cb - ub @ g
        ok = (a > 1) & (b > 1)                    # a reading at or under the offset has no log
        if ok.sum() < MIN_SAMPLES:
            if plain is None:                     # nothing to tell it by
                return None
            g, plain, step = plain, None, None    # an extrapolation overshot: back to the plain step
            continue
        a, b = np.where(ok, a, 1.0), np.where(ok, b, 1.0)
        r = np.log(a) - np.log(b)
        w = np.where(ok, a * b / (a + b), 0.0)
        if c is None:                             # outliers (misregistered or moving objects): robust weights,
            wt = _robust_weights(A, r, w / w.mean())
        else:                                     # then from the last flatfield fit's residual
            res = r - A @ c
            wt = w / (1 + (res / (ROBUST_C * robust_std(res[ok], about_zero=True) + 1e-12)) ** 2)
        G = (A * wt[:, None]).T @ A
        c = np.linalg.lstsq(G, (A * wt[:, None]).T @ r, rcond=None)[0]   # a pair with no valid sample: its term 0
        rho = np.exp(A @ c)
        y, X = ca - rho * cb, ua - rho[:, None] * ub
        v = 1.0 / (ca + rho ** 2 * cb)
        vw = v
        for _ in range(4):
            new = np.linalg.solve((X * vw[:, None]).T @ X, (X * vw[:, None]).T @ y)
            res = (y - X @ new) * np.sqrt(v)
            vw = v / (1 + (res / (ROBUST_C * robust_std(res, about_zero=True) + 1e-12)) ** 2)
        before, step, plain = step, new - g, None
        if before is not None:                    # the alternation converges geometrically: its limit (Aitken)
            ratio = float(step @ before) / float(before @ before + 1e-12)
            if 0 < ratio < 1:
                plain, new = new, new + ratio / (1 - ratio) * step
        if not np.all(np.isfinite(new)):         # the flatfield's ratio diverged: no answer from here
            return None
        g = new
        if np.abs(step).max() < OVERLAP_TOLERANCE:
            break
    return g


def envelope_excess(low: np.ndarray, offset: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """What of a plane's low envelope ``low`` (``offset_envelope``: of tiles averaged enough) lies above the
    camera offset and the light floor under ``flat`` (working size, counts, >= 0): the part of the additive term
    a flatfield refined with the envelope subtracted (``refine_flatfield``'s "envelope") was fitted with that is
    not the camera's. That flatfield holds only with the same term subtracted: subtracting the offset alone
    divides this part by the flatfield instead. It is light fixed to the sensor -- stray excitation light,
    reflections, glare: added, not shaded -- and the specimen the dimmest tiles happened to show at each pixel.

    The envelope less the offset less the light floor m F (m the SUPPORT_QUANTILE of what is left over F: the
    dimmest tiles' light stays light), smoothed by ENVELOPE_SIGMA (such light is smooth, nuclei are not).
    Measured on ../shared/realdata/wsi_brain (63 tiles of 512 px; the minimum over the tiles is highest in two
    corners, where the flatfield is lowest: stray light of up to ~550 counts): the overlaps chose the envelope;
    with the offset alone subtracted, each overlap's two corrected readings were 7.4 % apart (median |log
    ratio|), with this part too 2.8 % (the flatfield fitted with the offset alone and that subtracted: 3.4 %;
    basicpy 2.0.0's flat- and darkfield: 4.0 %)."""
    flat = np.asarray(flat, np.float64) / float(np.mean(flat))
    e = np.asarray(low, np.float64) - offset
    m = np.quantile(e / flat, SUPPORT_QUANTILE)
    return np.maximum(ndimage.gaussian_filter(e - m * flat, ENVELOPE_SIGMA, mode="nearest"), 0).astype(np.float32)


def fixed_to_sensor(tiles: np.ndarray, scale, offset: np.ndarray, flat: np.ndarray) -> np.ndarray | None:
    """Where the envelope's excess over the camera offset (``envelope_excess``) is light fixed to the sensor
    (stray light, glare) rather than the specimen the dimmest tiles happened to show: the first is the same in
    every tile, the second is not. The excess is made from two disjoint halves of the tiles (alternate ones) and
    compared across the sensor: it is the sensor's where the split-half reliability of the whole set's excess,
    2 r / (1 + r) (Spearman-Brown, r the halves' correlation), is at least SENSOR_FIXED_RELIABILITY: at most a
    tenth of its variation across the sensor is the tiles' (the tenth an offset may be uncertain by,
    UNCERTAIN_OF_FLOOR). Subtracted, all of it goes into every corrected pixel, and it is large exactly where it
    is least sure: under a dense stain the dimmest tiles' specimen and the flatfield's error times a bright light
    floor make an excess of 120-215 counts that the halves share only in part.

    Returns None where it is not the sensor's; where it is, the pixels it is the sensor's at: all of them where the
    halves agree on all of it, else those where the halves do not differ far (by more than FAR_ABOVE robust
    spreads of their difference: there one half's dimmest tiles still showed specimen), if the halves agree there.

    Measured without overlaps: r = 0.95-1.00 on the real wsi_brain tiles (stray light of up to ~550 counts in two
    corners; all 63, or alternate halves), on a field imaged again and again (a time lapse) and on 80 counts of
    stray light in one corner on 3 of 5 stacks (tests/test_shading.py); on the other 2, 0.53-0.80 over all
    pixels (specimen in all of a half's dimmest tiles at some places) and 1.00 once 12-24 % of them are left
    out. Under a dense stain (5 planes of 30 tiles, an excess of 120-215 counts: subtracted, the output's
    intercept -186 and -240 counts instead of -39 and -34) 0.20-0.45, and 0.02-0.45 with the far pixels left out
    (4 stacks); -0.17 to 0.24 on dense nuclei, a sparse marker and a dim one at random places
    (bench/basic_alone.py)."""
    if len(tiles) < 4:
        return None
    halves = [envelope_excess(offset_envelope(tiles[h::2], scale), offset, flat) for h in (0, 1)]

    def reliable(a, b):
        if min(float(np.std(a)), float(np.std(b))) <= 0:
            return False
        r = float(np.corrcoef(a, b)[0, 1])
        return r > 0 and 2 * r / (1 + r) >= SENSOR_FIXED_RELIABILITY
    if reliable(halves[0].ravel(), halves[1].ravel()):
        return np.ones(halves[0].shape, bool)
    d = halves[0] - halves[1]
    agree = np.abs(d - np.median(d)) <= FAR_ABOVE * robust_std(d)
    return agree if agree.sum() > 2 and reliable(halves[0][agree], halves[1][agree]) else None


def _broad_part(excess: np.ndarray, where: np.ndarray) -> np.ndarray:
    """The light fixed to the sensor in an excess the tiles' halves agree on only at ``where``: its broad part, a
    polynomial of total degree STRAY_DEGREE fitted there with Cauchy weights (``_robust_weights``), >= 0. Stray
    light reaches the sensor out of focus and varies over tens of pixels; the specimen left in the excess where
    every dimmest tile still showed it is the size of cells or tissue. Measured on the 2 of 5 stacks with 80
    counts of glow in one corner that the whole excess's halves disagree on (3 planes each): the darkfield's
    error -82..-1 counts with the offset alone, -8..+267 with the whole excess, -10..+17 with its broad part."""
    h, w = excess.shape
    yy, xx = np.mgrid[0:h, 0:w]
    A = _basis(2 * yy.ravel() / max(h - 1, 1) - 1, 2 * xx.ravel() / max(w - 1, 1) - 1, STRAY_DEGREE)
    at = where.ravel()
    r = np.asarray(excess, np.float64).ravel()[at]
    c = _weighted_solve(A[at], r, _robust_weights(A[at], r, np.ones(r.size)))
    return np.maximum(A @ c, 0).reshape(h, w).astype(np.float32)


def _added_light(ref: Refinement, tiles: np.ndarray, scale, camera: np.ndarray, flat: np.ndarray,
                 low: np.ndarray | None = None):
    """What is subtracted with the camera offset ``camera``: the envelope's excess over it (``envelope_excess``;
    ``low``: the plane's ``offset_envelope`` where the caller has it) where the overlaps chose the envelope, or
    where there were too few overlaps to choose (BaSiC's flatfield kept: fitted with the envelope subtracted) and
    the excess is fixed to the sensor (``fixed_to_sensor``: all of it, or where the tiles' halves agree on it only
    in part its broad part, ``_broad_part``); else 0. Without overlaps on wsi_brain (63 tiles, fitted on all, or
    on alternate halves; judged at the 87 overlaps of all of them): the overlaps' two corrected readings 9.0 %,
    19.7 % and 5.7 % apart with the offset alone subtracted, 5.2 %, 8.4 % and 4.9 % with the excess too."""
    if ref.additive == "envelope":                # the overlaps chose it: all of the excess
        where = None
    elif ref.degree is None:                      # no overlaps to choose by
        where = fixed_to_sensor(tiles, scale, camera, flat)
        if where is None:
            return 0.0
    else:                                         # the overlaps chose the offset alone
        return 0.0
    excess = envelope_excess(offset_envelope(tiles, scale) if low is None else low, camera, flat)
    return excess if where is None or where.all() else _broad_part(excess, where)


@dataclass(frozen=True)
class PlaneShading:
    """A plane's shading at working size: what the stitch stage corrects with."""

    flatfield: np.ndarray        # mean 1
    darkfield: np.ndarray        # the camera offset, subtracted from the output
    refinement: Refinement
    offset: str                  # "fitted", "given" or "off"
    light_floor: float = 0.0     # light the dimmest tiles carry above the fitted offset (mean counts)
    offset_uncertain: bool = False
    added_light: float = 0.0     # mean counts of the envelope's excess (``envelope_excess``), in the darkfield too
    offset_mean: float = 0.0     # the camera offset's mean (counts), from the offset itself: the same number on every
                                 # plane of a channel (the darkfield's mean less the excess differs in float32 rounding)


def first_flatfield(tiles: np.ndarray, basic_flat: np.ndarray, envelope: np.ndarray, pairs, scale) -> np.ndarray:
    """A plane's flatfield refined with its low envelope subtracted: what its light floor is shaped by,
    for the channel's offset (estimate_channel_offset)."""
    return refine_flatfield(tiles, basic_flat, {"envelope": envelope}, pairs, scale)[0]


def shade_with_offset(tiles: np.ndarray, basic_flat: np.ndarray, envelope: np.ndarray, pairs, scale,
                      offset: ChannelOffset, low: np.ndarray | None = None) -> PlaneShading:
    """A plane's flatfield refined with its channel's fitted offset or its envelope subtracted; its darkfield the
    offset, and where the envelope was chosen the envelope's excess over it too (``envelope_excess``): the output
    is corrected with the additive term its flatfield was fitted with. ``low``: the plane's ``offset_envelope``
    where the caller has it (the offset was fitted to it), else made here."""
    flat, ref = refine_flatfield(tiles, basic_flat, {"offset": offset.image, "envelope": envelope}, pairs, scale,
                                 offset.image)
    light = _added_light(ref, tiles, scale, offset.image, flat, low)
    return PlaneShading(flat, offset.image + light, ref, "fitted", offset.light_floor, offset.uncertain,
                        float(np.mean(light)), float(offset.image.mean()))


def shade_plane(tiles: np.ndarray, basic_flat: np.ndarray, envelope: np.ndarray | None, pairs, scale,
                known_offset: np.ndarray | None = None) -> PlaneShading:
    """Flatfield and offset of one plane (host arrays at working size); see the module doc.

    ``envelope``: BaSiC's darkfield (the low envelope; None when the darkfield is off);
    ``known_offset``: the offset the user gave (a constant or a dark frame at working size)."""
    if envelope is None:                          # basic.darkfield: false
        zero = np.zeros_like(basic_flat)
        flat, ref = refine_flatfield(tiles, basic_flat, {"offset": zero}, pairs, scale)
        return PlaneShading(flat, zero, ref, "off")
    if known_offset is not None:                  # a dark frame holds the camera, not light added on the sensor
        known_offset = np.asarray(known_offset, np.float32)
        flat, ref = refine_flatfield(tiles, basic_flat, {"offset": known_offset, "envelope": envelope}, pairs, scale,
                                     known_offset)
        light = _added_light(ref, tiles, scale, known_offset, flat)
        return PlaneShading(flat, known_offset + light, ref, "given", added_light=float(np.mean(light)),
                            offset_mean=float(known_offset.mean()))
    offsets, lows = channel_offsets({0: [0]}, lambda _: (tiles, basic_flat, envelope), pairs, scale)
    return shade_with_offset(tiles, basic_flat, envelope, pairs, scale, offsets[0], lows[0])
