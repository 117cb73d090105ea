"""Grid stitching on the NumPy/CuPy seam.

1. Pairwise: each pair of neighbouring tiles is aligned from its overlap strips by
   phase correlation (``phasecorr``: whitened, windowed, sub-pixel), scored by NCC; an accepted
   pair's offset is then fitted on the tiles' exact overlap (``overlap_fit``), which strips cut at
   the nominal step do not give at narrow overlaps.
2. Stage model: from the pairs whose peak is clearly above noise (extreme-value bound)
   and unambiguous, the step between neighbours per direction (median: rotation of the
   camera, stage scale and mean offset in one vector) and the spread of single pairs around
   it (rms of those within a loose bound). Outlier pairs (chance matches on bare slide, dust)
   cannot move a median.
3. Acceptance: a pair is accepted when the correlation peak within the model's window
   (``SPREAD_SIGMAS`` rms spreads of the clear matches, at least ``MIN_WINDOW_PX``, or
   ``max_shift_px``) beats both the extreme-value bound of noise over the positions of that
   window and the 99th percentile of what mismatched strips reach in the same window (their
   blobs align with blobs: a null from many samples, not the single best). A pair's own evidence
   and the model's prediction together: a chance match must land in a few pixels out of
   thousands, so weakly textured but right pairs pass while no accepted pair can be more
   than the window away from where the stage put it.
4. Quality gate: when fewer than two thirds of the pairs whose overlaps carry tissue match, or
   fewer than half the clear matches agree with the model (a wrong rows x cols, order or
   overlap makes neighbours that are not), the stitch fails in one line naming the grid keys;
   ``pairs.csv`` is written first, to look at.
5. Global: positions by weighted least squares over accepted pairs, with the stage model
   placing tiles whose pairs were all rejected; pairs that disagree with the solution are dropped.
6. Blending: every tile is placed at its sub-pixel position (cubic convolution, Keys 1981)
   with a smooth linear ramp over the overlaps.

One model per cycle, computed on the reference channel's middle z-plane, is applied
to every channel and plane.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from .. import xp as xpmod
from . import overlap_fit, texture
from .phasecorr import ncc, noise_threshold, phase_correlation
from .robust import robust_std
from .subpixel import shift_fraction

MAX_AMBIGUITY = 0.7      # second peak / first peak above this = repetitive texture
MAX_RESIDUAL_PX = 2.0    # an accepted pair disagreeing more than this with the solution is dropped
PRIOR_WEIGHT = 1e-3      # weight of the stage model relative to one good pair
SPREAD_SIGMAS = 5.0      # the model window: this many robust stds of single pairs around the model ...
MIN_WINDOW_PX = 2.0      # ... and never less (a spread from a handful of pairs is itself uncertain)
MIN_MODEL_PAIRS = 3      # clear matches needed per direction to fit its step; fewer: the nominal step ...
UNFITTED_WINDOW_PX = 10.0  # ... searched this far (the rotation of a camera by 1 deg moves 1000 px by 17)
MIN_AGREEMENT = 0.5      # quality gate: at least this fraction of the clear matches agree with the model,
MIN_TISSUE_ACCEPTED = 2 / 3  # ... this fraction of the pairs whose overlaps carry tissue is accepted (right grids:
                         # wsi_brain 100 %, synthetic regimes >= 90 %; a 4x4 snake given as 2x8: 45 %)
TISSUE_FRACTION = 0.25   # a strip carries tissue at this fraction of the brightest strips' mean (90th pct)
MIN_GATE_PAIRS = 4       # ... judged once there are this many pairs
NULL_SHIFTS = 2          # mismatched strips per pair for the null (strip a of one pair, strip b of another)
NULL_QUANTILE = 0.99     # a pair must beat this quantile of the null's window peaks ...
MIN_NULL = 20            # ... once there are this many null samples (else the noise bound alone)


class StitchQualityError(ValueError):
    """The pairs do not fit a regular grid: a wrong grid in the config, most likely."""


@dataclass
class Pair:
    a: int                   # tile index (0-based, acquisition order)
    b: int
    direction: str           # "h": b is right of a; "v": b is below a
    dy: float = 0.0          # measured deviation from the nominal step, px
    dx: float = 0.0
    significance: float = 0.0
    ambiguity: float = 1.0
    ncc: float = 0.0
    accepted: bool = False
    reason: str = ""
    clear: bool = False          # its best peak anywhere is above noise and unambiguous
    agrees: bool = False         # ... and lies within the stage model's window
    content: float = 0.0         # mean intensity of the dimmer of its two strips (tissue or bare slide)
    texture_a: float = 0.0       # structure above noise of a's strip and of b's (texture.measure: snr)
    texture_b: float = 0.0
    off_model: tuple[float, float] | None = None   # a clear match outside the window: b's offset from the model there


@dataclass
class StitchModel:
    layout: list[tuple[int, int]]
    tile_shape: tuple[int, int]
    positions: np.ndarray            # (T, 2) float, y/x of each tile's top-left in mosaic px
    pairs: list[Pair] = field(default_factory=list)
    threshold: float = 0.0           # significance a pair's peak had to reach inside its window
    stage: "StageModel | None" = None

    @property
    def placement(self) -> np.ndarray:
        """Whole-pixel part of each position; the fraction is applied when blending."""
        return np.floor(self.positions).astype(int)

    @property
    def mosaic_shape(self) -> tuple[int, int]:
        p = self.placement
        return int(p[:, 0].max() + self.tile_shape[0]), int(p[:, 1].max() + self.tile_shape[1])

    def tile_scores(self) -> list[float]:
        best = [0.0] * len(self.layout)
        for p in self.pairs:
            if p.accepted:
                best[p.a] = max(best[p.a], p.ncc)
                best[p.b] = max(best[p.b], p.ncc)
        return best

    def positions_csv(self) -> str:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["tile", "row", "col", "y_px", "x_px", "score"])
        for t, ((r, c), (y, x), s) in enumerate(zip(self.layout, self.positions, self.tile_scores()), start=1):
            w.writerow([t, r, c, f"{y:.3f}", f"{x:.3f}", f"{s:.4f}"])
        return out.getvalue()

    def pairs_csv(self) -> str:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["tile_a", "tile_b", "direction", "dy_px", "dx_px", "significance", "ambiguity", "ncc",
                    "accepted", "reason", "texture_a", "texture_b", "off_model_dy_px", "off_model_dx_px"])
        for p in self.pairs:
            w.writerow([p.a + 1, p.b + 1, p.direction, f"{p.dy:.3f}", f"{p.dx:.3f}", f"{p.significance:.2f}",
                        f"{p.ambiguity:.3f}", f"{p.ncc:.4f}", int(p.accepted), p.reason, f"{p.texture_a:.2f}",
                        f"{p.texture_b:.2f}", *([f"{v:.2f}" for v in p.off_model] if p.off_model else ["", ""])])
        w.writerow([])
        w.writerow(["# significance threshold", f"{self.threshold:.2f}"])
        if self.stage is not None:
            for d, (dy, dx) in self.stage.deviation.items():
                w.writerow([f"# stage model {d}: deviation from the nominal step", f"{dy:.3f}", f"{dx:.3f}"])
            w.writerow(["# stage model: spread of single pairs (px), window (px), fitted on",
                        f"{self.stage.spread:.3f}", f"{self.stage.window:.2f}", self.stage.fitted_on])
        return out.getvalue()

    @classmethod
    def from_positions_csv(cls, text: str, tile_shape: tuple[int, int]) -> "StitchModel":
        rows = list(csv.DictReader(io.StringIO(text)))
        layout = [(int(r["row"]), int(r["col"])) for r in rows]
        pos = np.array([[float(r["y_px"]), float(r["x_px"])] for r in rows])
        return cls(layout=layout, tile_shape=tile_shape, positions=pos)


def nominal_step(tile_shape: tuple[int, int], overlap: float) -> tuple[int, int]:
    h, w = tile_shape
    return int(round(h * (1 - overlap))), int(round(w * (1 - overlap)))


def neighbour_pairs(layout: list[tuple[int, int]]) -> list[Pair]:
    where = {rc: i for i, rc in enumerate(layout)}
    pairs = []
    for i, (r, c) in enumerate(layout):
        if (r, c + 1) in where:
            pairs.append(Pair(i, where[(r, c + 1)], "h"))
        if (r + 1, c) in where:
            pairs.append(Pair(i, where[(r + 1, c)], "v"))
    return pairs


def _strips(ta, tb, direction: str, step: tuple[int, int]):
    """Overlap strips of a pair at the nominal step: (strip of a, strip of b)."""
    h, w = ta.shape
    if direction == "h":
        return ta[:, step[1]:], tb[:, :w - step[1]]
    return ta[step[0]:, :], tb[:h - step[0], :]


def _content(ta, tb, direction, step) -> tuple[float, float, float]:
    """(mean intensity of the dimmer strip, structure of a's strip, of b's) at the nominal step."""
    ka, kb = (texture.measure(s) for s in _strips(ta, tb, direction, step))
    return min(ka.light, kb.light), ka.snr, kb.snr


def _measure(ta, tb, direction, step, near=None, radius=None) -> tuple[float, float, float, float, int, float]:
    """(dy, dx, significance, ambiguity, positions searched, NCC) of b against a: b's deviation from
    the nominal step, searched everywhere or within ``radius`` px of the deviation ``near``."""
    sa, sb = _strips(ta, tb, direction, step)
    # b[y, x] ~ a[y - dy, x - dx] in strip coordinates -> b sits at nominal + (-dy, -dx) relative to a
    m = phase_correlation(sa, sb, near=None if near is None else (-near[0], -near[1]), radius=radius)
    dy, dx = -m.dy, -m.dx
    iy, ix = int(round(dy)), int(round(dx))
    # overlap of a and b with that offset, in strip coordinates of a
    ha, wa = sa.shape
    y0, y1 = max(0, iy), min(ha, ha + iy)
    x0, x1 = max(0, ix), min(wa, wa + ix)
    score = ncc(sa[y0:y1, x0:x1], sb[y0 - iy:y1 - iy, x0 - ix:x1 - ix]) if y1 - y0 > 4 and x1 - x0 > 4 else 0.0
    return dy, dx, m.significance, m.ambiguity, m.n, score


@dataclass(frozen=True)
class StageModel:
    """How the stage steps between neighbours, seen in the image: per direction the deviation
    from the nominal step (camera rotation, stage scale, mean offset), the spread of single pairs
    around it, and the window a pair's match is searched in."""

    deviation: dict                  # {"h": (dy, dx), "v": (dy, dx)} px
    spread: float                    # robust std of single pairs around the model, px (nan: unfitted)
    window: float                    # half width of the search window around the model, px
    fitted_on: int                   # clear matches the model was fitted on

    def step_vector(self, direction: str, step: tuple[int, int]) -> np.ndarray:
        nominal = np.array([0.0, step[1]]) if direction == "h" else np.array([step[0], 0.0])
        return nominal + np.asarray(self.deviation[direction], float)


def fit_stage_model(clear: list[Pair], max_shift_px: float | None = None) -> StageModel:
    """Median deviation per direction of the clear matches; spread = the rms distance to it (per
    axis) of the matches within UNFITTED_WINDOW_PX (or 5 MADs, where larger) of it; window =
    SPREAD_SIGMAS spreads (>= MIN_WINDOW_PX), or ``max_shift_px`` where the user set it. A direction
    with fewer than MIN_MODEL_PAIRS clear matches keeps the nominal step, searched
    UNFITTED_WINDOW_PX (or the spread's window, where larger) far."""
    deviation, residuals, fitted = {}, [], True
    for d in ("h", "v"):
        group = np.array([(p.dy, p.dx) for p in clear if p.direction == d], float).reshape(-1, 2)
        if len(group) < MIN_MODEL_PAIRS:
            deviation[d], fitted = (0.0, 0.0), False
            continue
        centre = np.median(group, axis=0)
        deviation[d] = (float(centre[0]), float(centre[1]))
        residuals.append(group - centre)
    spread = float("nan")
    if residuals:
        res = np.concatenate(residuals)
        loose = max(UNFITTED_WINDOW_PX, 5 * robust_std(res, about_zero=True))
        inliers = res[np.abs(res).max(axis=1) <= loose]      # chance matches far away do not count
        spread = float(np.sqrt(np.mean(inliers ** 2))) if len(inliers) else float("nan")
    if max_shift_px is not None:
        window = float(max_shift_px)
    elif not math.isfinite(spread):
        window = UNFITTED_WINDOW_PX
    else:
        window = max(MIN_WINDOW_PX if fitted else UNFITTED_WINDOW_PX, SPREAD_SIGMAS * spread)
    return StageModel(deviation=deviation, spread=spread, window=window, fitted_on=len(clear))


def register_pairs(tiles, layout, step, max_shift_px: float | None = None) -> tuple[list[Pair], StageModel, float]:
    """Measure and judge every neighbouring pair. ``tiles``: sequence of 2-D arrays (host or device).

    Returns the pairs, the stage model and the significance a peak had to reach inside its window."""
    pairs = neighbour_pairs(layout)
    for p in pairs:
        p.dy, p.dx, p.significance, p.ambiguity, n, p.ncc = _measure(tiles[p.a], tiles[p.b], p.direction, step)
        p.clear = p.significance >= noise_threshold(n) and p.ambiguity <= MAX_AMBIGUITY
        p.content, p.texture_a, p.texture_b = _content(tiles[p.a], tiles[p.b], p.direction, step)
    stage = fit_stage_model([p for p in pairs if p.clear], max_shift_px)
    null = window_null(tiles, pairs, step, stage)
    null_sig = float(np.quantile(null, NULL_QUANTILE)) if len(null) >= MIN_NULL else 0.0
    threshold = 0.0
    for p in pairs:
        near = stage.deviation[p.direction]
        if max(abs(p.dy - near[0]), abs(p.dx - near[1])) <= stage.window:
            p.agrees = p.clear
            n = _window_positions(stage.window)
        else:                                        # its best peak lies elsewhere: the best one inside
            if p.clear:
                p.off_model = (p.dy - near[0], p.dx - near[1])
            p.dy, p.dx, p.significance, p.ambiguity, n, p.ncc = _measure(
                tiles[p.a], tiles[p.b], p.direction, step, near=near, radius=stage.window)
        thr = max(noise_threshold(n), null_sig)
        threshold = max(threshold, thr)
        p.accepted = p.significance >= thr
        if p.accepted:
            p.reason = ""
        elif p.clear and p.off_model is None:      # inside the window, but no more than mismatched strips reach
            p.reason = (f"its match ({p.significance:.1f}) is no stronger than mismatched strips reach in the "
                        f"window ({thr:.1f}): " + _why_no_match(p))
        elif p.clear:
            p.reason = (f"clear match {max(map(abs, p.off_model)):.1f} px from the stage model, outside its window "
                        f"({stage.window:.1f} px), nothing significant inside ({p.significance:.1f} < {thr:.1f})")
        else:
            p.reason = f"not significant ({p.significance:.1f} < {thr:.1f}): " + _why_no_match(p)
        if p.accepted:
            _fit_on_overlap(p, tiles, step, stage)
    return pairs, stage, threshold


def _fit_on_overlap(p: Pair, tiles, step, stage: StageModel) -> None:
    """An accepted pair's offset refined on its exact overlap (overlap_fit), kept where it stays in the
    stage model's window: the strips at the nominal step lose width to the window and to the offset,
    which at narrow overlaps puts phase correlation pixels off."""
    nominal = np.array([0.0, step[1]]) if p.direction == "h" else np.array([step[0], 0.0])
    fit = overlap_fit.fit_offset(tiles[p.a], tiles[p.b], nominal + (p.dy, p.dx))
    dy, dx = np.asarray(fit.offset) - nominal
    near = stage.deviation[p.direction]
    if fit.moved and max(abs(dy - near[0]), abs(dx - near[1])) <= stage.window:
        p.dy, p.dx, p.ncc = float(dy), float(dx), fit.ncc


def _why_no_match(p: Pair) -> str:
    """Why a pair found nothing. The two strips image the same patch of slide with the same optics, so
    they hold texture alike: neither (bare slide, out of focus: nothing to lock onto), one only (they
    do not show the same patch: a blank frame or a tile of another field), or both, matching at no
    offset (a tile of another field or specimen, or neighbours that are not)."""
    ka, kb = p.texture_a, p.texture_b
    structure = f"(structure {ka:.1f} and {kb:.1f} noise sigmas)"
    if max(ka, kb) < texture.MIN_TEXTURE_SNR:
        return f"no texture on either side {structure}: bare slide, blank or out of focus"
    if min(ka, kb) < texture.MIN_TEXTURE_SNR:
        empty, full = (p.a, p.b) if ka < kb else (p.b, p.a)
        return (f"texture in tile {full + 1}'s side, none in tile {empty + 1}'s {structure}: they do not show the "
                "same patch")
    return f"texture on both sides {structure} that matches at no offset: a tile of another field, or a wrong grid"


def window_null(tiles, pairs: list[Pair], step, stage: StageModel) -> list[float]:
    """Significances of deliberately mismatched strips (strip a of one pair against strip b of
    another pair of the same direction, no tile shared), searched in the stage model's window as
    real pairs are: what unrelated content reaches there (blobs align with blobs)."""
    out = []
    for d in ("h", "v"):
        group = [p for p in pairs if p.direction == d]
        if len(group) < 3:
            continue
        for k in range(1, NULL_SHIFTS + 1):
            shift = max(1, k * len(group) // (NULL_SHIFTS + 1))
            for i, p in enumerate(group):
                q = group[(i + shift) % len(group)]
                if {q.a, q.b} & {p.a, p.b}:
                    continue
                out.append(_measure(tiles[p.a], tiles[q.b], d, step, near=stage.deviation[d],
                                    radius=stage.window)[2])
    return out


def _window_positions(radius: float) -> int:
    """Whole-pixel positions within ``radius`` px of a point along each axis."""
    return int(2 * math.floor(radius) + 1) ** 2


def tissue_pairs(pairs: list[Pair]) -> list[Pair]:
    """Pairs whose two strips both carry tissue: at least TISSUE_FRACTION of the brightness of the
    brightest strips (90th percentile), so bare slide does not count."""
    if not pairs:
        return []
    bright = float(np.percentile([p.content for p in pairs], 90))
    return [p for p in pairs if bright > 0 and p.content >= TISSUE_FRACTION * bright]


def focus_problem(pairs: list[Pair]) -> str | None:
    """Why too few pairs whose overlaps carry light match, where most of those rejected hold no texture
    on either side: light without detail is a cycle out of focus (or a stain too faint), not a wrong
    grid (whose overlaps keep their texture, mismatched). None where that is not the case."""
    tissue = tissue_pairs(pairs)
    rejected = [p for p in tissue if not p.accepted]
    flat = [p for p in rejected if max(p.texture_a, p.texture_b) < texture.MIN_TEXTURE_SNR]
    if len(tissue) >= MIN_GATE_PAIRS and len(rejected) > (1 - MIN_TISSUE_ACCEPTED) * len(tissue) \
            and len(flat) > len(rejected) / 2:
        median = float(np.median([max(p.texture_a, p.texture_b) for p in flat]))
        return (f"only {len(tissue) - len(rejected)} of {len(tissue)} neighbouring tile pairs whose overlaps carry "
                f"light match, and {len(flat)} of those rejected hold no texture (median structure {median:.1f} noise "
                "sigmas): the cycle is out of focus or its reference channel too faint to stitch")
    return None


def grid_problem(pairs: list[Pair]) -> str | None:
    """Quality gate: why the pairs do not fit one regular grid, or None when they do."""
    tissue = tissue_pairs(pairs)
    accepted = sum(p.accepted for p in tissue)
    if len(tissue) >= MIN_GATE_PAIRS and accepted < MIN_TISSUE_ACCEPTED * len(tissue):
        return (f"only {accepted} of {len(tissue)} neighbouring tile pairs whose overlaps both carry tissue match "
                f"(need {MIN_TISSUE_ACCEPTED:.0%})")
    clear = [p for p in pairs if p.clear]
    agreeing = sum(p.agrees for p in clear)
    if len(clear) >= MIN_GATE_PAIRS and agreeing < MIN_AGREEMENT * len(clear):
        return (f"only {agreeing} of {len(clear)} neighbouring tile pairs with a clear match agree with one "
                f"regular grid (need {MIN_AGREEMENT:.0%})")
    dropped = sum(p.reason.startswith("disagrees") for p in pairs)
    kept = sum(p.accepted for p in pairs)
    if dropped >= MIN_GATE_PAIRS and dropped > kept:
        return f"{dropped} accepted pairs disagree with the positions the other {kept} give"
    return None


def solve_positions(pairs: list[Pair], layout, step, stage: StageModel) -> np.ndarray:
    """Weighted least squares over accepted pairs plus a weak prior: the stage model's grid.

    Each pair weighs as the inverse variance of its peak position, which falls with the square
    of the peak's signal-to-noise ratio (its significance): a faint match on bare slide counts far
    less than a textured one (measured on wsi_brain against Fiji's positions: median 0.28 px with
    these weights, 0.36 px with equal ones)."""
    n = len(layout)
    step_vec = {"h": np.array([0.0, step[1]]), "v": np.array([step[0], 0.0])}
    prior = np.array([r * stage.step_vector("v", step) + c * stage.step_vector("h", step) for r, c in layout])
    active = [p for p in pairs if p.accepted]
    scale = float(np.median([p.significance ** 2 for p in active])) if active else 1.0
    while True:
        rows, rhs, wts = [], [], []
        for p in active:
            row = np.zeros(n)
            row[p.b], row[p.a] = 1.0, -1.0
            rows.append(row)
            rhs.append(step_vec[p.direction] + (p.dy, p.dx))
            wts.append(p.significance ** 2 / scale)
        for t in range(n):
            row = np.zeros(n)
            row[t] = 1.0
            rows.append(row)
            rhs.append(prior[t])
            wts.append(PRIOR_WEIGHT)
        A = np.array(rows) * np.sqrt(wts)[:, None]
        b = np.array(rhs) * np.sqrt(wts)[:, None]
        pos = np.linalg.lstsq(A, b, rcond=None)[0]
        if not active:
            break
        resid = [np.abs(pos[p.b] - pos[p.a] - step_vec[p.direction] - (p.dy, p.dx)).max() for p in active]
        worst = int(np.argmax(resid))
        if resid[worst] <= MAX_RESIDUAL_PX:
            break
        bad = active.pop(worst)
        bad.accepted = False
        bad.reason = f"disagrees with the other pairs by {resid[worst]:.1f} px"
    return pos - pos.min(axis=0)


def compute_model(tiles, layout, overlap: float, max_shift_px: float | None = None) -> StitchModel:
    """The stitching model of one cycle from one plane's (flat-field corrected) tiles.

    ``max_shift_px``: the window around the stage model a pair's match must lie in (default:
    from the spread of the pairs, see ``fit_stage_model``). Check ``grid_problem(model.pairs)``
    before using the model."""
    tile_shape = tuple(int(s) for s in tiles[0].shape)
    step = nominal_step(tile_shape, overlap)
    pairs, stage, threshold = register_pairs(tiles, layout, step, max_shift_px)
    positions = solve_positions(pairs, layout, step, stage)
    return StitchModel(layout=list(layout), tile_shape=tile_shape, positions=positions, pairs=pairs,
                       threshold=threshold, stage=stage)


def ramp_weights(xp, tile_shape: tuple[int, int], ramp: int):
    h, w = tile_shape
    ramp = max(1, ramp)
    wy = xp.minimum(xp.arange(1, h + 1), xp.arange(h, 0, -1)).astype(xp.float32)
    wx = xp.minimum(xp.arange(1, w + 1), xp.arange(w, 0, -1)).astype(xp.float32)
    return xp.clip(wy / ramp, 0, 1)[:, None] * xp.clip(wx / ramp, 0, 1)[None, :]


def blend(tiles, model: StitchModel, ramp: int | None = None):
    """Mosaic of one plane: tiles placed at the model's (sub-pixel) positions, overlaps feathered.

    ``tiles`` may be any iterable in acquisition order (a generator keeps one tile in memory)."""
    tiles = iter(tiles)
    first = next(tiles)
    xp = xpmod.array_module(first)
    h, w = model.tile_shape
    if ramp is None:
        ramp = max(1, min(h, w) // 8)
    weights = ramp_weights(xp, (h, w), ramp)
    acc = xp.zeros(model.mosaic_shape, xp.float32)
    wsum = xp.zeros(model.mosaic_shape, xp.float32)
    fractions = model.positions - model.placement
    for tile, (y, x), frac in zip(itertools.chain([first], tiles), model.placement, fractions):
        acc[y:y + h, x:x + w] += shift_fraction(tile, frac) * weights
        wsum[y:y + h, x:x + w] += weights
    xp.maximum(wsum, 1e-12, out=wsum)     # where no tile reaches, acc is 0 and stays 0
    acc /= wsum
    return acc
