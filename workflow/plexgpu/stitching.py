"""Grid stitching on the NumPy/CuPy seam.

1. Pairwise: each pair of neighbouring tiles is aligned from its overlap strips by
   whitened, Hann-windowed phase correlation (sub-pixel peak), scored by NCC.
2. Reliability: a pair is rejected when its correlation peak is not significant
   (blank background), ambiguous (repetitive texture) or beyond the largest stage
   error. The significance threshold is derived from the data: the larger of the
   extreme-value bound for noise and the best score of deliberately mismatched strips.
3. Global: positions by weighted least squares over accepted pairs, with the stage
   model (step vectors measured from accepted pairs, nominal otherwise) placing tiles
   whose pairs were all rejected; pairs that disagree with the solution are dropped.
4. Blending: every tile is placed at its rounded position with a smooth linear ramp.

One model per cycle, computed on the reference channel's middle z-plane, is applied
to every channel and plane.
"""

from __future__ import annotations

import itertools

import csv
import io
from dataclasses import dataclass, field

import numpy as np

from . import xp as xpmod
from .phasecorr import Match, ncc, phase_correlation

MAX_AMBIGUITY = 0.7      # second peak / first peak above this = repetitive texture
MAX_RESIDUAL_PX = 2.0    # an accepted pair disagreeing more than this with the solution is dropped
PRIOR_WEIGHT = 1e-3      # weight of the stage model relative to one good pair


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


@dataclass
class StitchModel:
    layout: list[tuple[int, int]]
    tile_shape: tuple[int, int]
    positions: np.ndarray            # (T, 2) float, y/x of each tile's top-left in mosaic px
    pairs: list[Pair] = field(default_factory=list)
    threshold: float = 0.0

    @property
    def placement(self) -> np.ndarray:
        return np.rint(self.positions).astype(int)

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
                    "accepted", "reason"])
        for p in self.pairs:
            w.writerow([p.a + 1, p.b + 1, p.direction, f"{p.dy:.3f}", f"{p.dx:.3f}", f"{p.significance:.2f}",
                        f"{p.ambiguity:.3f}", f"{p.ncc:.4f}", int(p.accepted), p.reason])
        w.writerow([])
        w.writerow(["# significance threshold", f"{self.threshold:.2f}"])
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


def _measure(ta, tb, direction, step) -> tuple[Match, float]:
    sa, sb = _strips(ta, tb, direction, step)
    m = phase_correlation(sa, sb)
    # b[y, x] ~ a[y - dy, x - dx] in strip coordinates -> b sits at nominal + (-dy, -dx) relative to a
    dy, dx = -m.dy, -m.dx
    iy, ix = int(round(dy)), int(round(dx))
    # overlap of a and b with that offset, in strip coordinates of a
    ha, wa = sa.shape
    y0, y1 = max(0, iy), min(ha, ha + iy)
    x0, x1 = max(0, ix), min(wa, wa + ix)
    score = ncc(sa[y0:y1, x0:x1], sb[y0 - iy:y1 - iy, x0 - ix:x1 - ix]) if y1 - y0 > 4 and x1 - x0 > 4 else 0.0
    return Match(dy, dx, m.significance, m.ambiguity, m.n), score


def _null_threshold(tiles, pairs: list[Pair], step) -> float:
    """Best significance among deliberately mismatched strips (same direction, unrelated tiles)."""
    best = 0.0
    for direction in ("h", "v"):
        group = [p for p in pairs if p.direction == direction]
        if len(group) < 3:
            continue
        shift = len(group) // 2
        for k, p in enumerate(group):
            q = group[(k + shift) % len(group)]
            if {q.a, q.b} & {p.a, p.b}:
                continue
            sa, _ = _strips(tiles[p.a], tiles[p.b], direction, step)
            _, sb = _strips(tiles[q.a], tiles[q.b], direction, step)
            best = max(best, phase_correlation(sa, sb).significance)
    return best


def register_pairs(tiles, layout, step, max_shift: float) -> tuple[list[Pair], float]:
    """Measure and judge every neighbouring pair. ``tiles``: sequence of 2-D arrays (host or device)."""
    pairs = neighbour_pairs(layout)
    null = _null_threshold(tiles, pairs, step)
    threshold = 0.0
    for p in pairs:
        m, score = _measure(tiles[p.a], tiles[p.b], p.direction, step)
        p.dy, p.dx, p.significance, p.ambiguity, p.ncc = m.dy, m.dx, m.significance, m.ambiguity, score
        thr = max(m.noise_threshold, null * 1.2)
        threshold = max(threshold, thr)
        if m.significance < thr:
            p.reason = f"not significant ({m.significance:.1f} < {thr:.1f}): blank or featureless overlap"
        elif m.ambiguity > MAX_AMBIGUITY:
            p.reason = f"ambiguous peak ({m.ambiguity:.2f} > {MAX_AMBIGUITY}): repetitive texture"
        elif max(abs(m.dy), abs(m.dx)) > max_shift:
            p.reason = f"shift ({m.dy:.1f}, {m.dx:.1f}) beyond max_shift_px {max_shift:.0f}"
        else:
            p.accepted = True
    return pairs, threshold


def solve_positions(pairs: list[Pair], layout, step) -> np.ndarray:
    """Weighted least squares over accepted pairs plus a weak stage-model prior."""
    n = len(layout)
    step_vec = {"h": np.array([0.0, step[1]]), "v": np.array([step[0], 0.0])}
    measured = {}
    for d in ("h", "v"):
        acc = [step_vec[d] + (p.dy, p.dx) for p in pairs if p.accepted and p.direction == d]
        measured[d] = np.median(acc, axis=0) if acc else step_vec[d]
    prior = np.array([r * measured["v"] + c * measured["h"] for r, c in layout])
    active = [p for p in pairs if p.accepted]
    while True:
        rows, rhs, wts = [], [], []
        for p in active:
            row = np.zeros(n)
            row[p.b], row[p.a] = 1.0, -1.0
            rows.append(row)
            rhs.append(step_vec[p.direction] + (p.dy, p.dx))
            wts.append(1.0)
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
    """The stitching model of one cycle from one plane's (flat-field corrected) tiles."""
    tile_shape = tuple(int(s) for s in tiles[0].shape)
    step = nominal_step(tile_shape, overlap)
    ov = min(tile_shape[0] - step[0], tile_shape[1] - step[1])
    max_shift = max_shift_px if max_shift_px is not None else 0.1 * ov + 5
    pairs, threshold = register_pairs(tiles, layout, step, max_shift)
    positions = solve_positions(pairs, layout, step)
    return StitchModel(layout=list(layout), tile_shape=tile_shape, positions=positions, pairs=pairs,
                       threshold=threshold)


def ramp_weights(xp, tile_shape: tuple[int, int], ramp: int):
    h, w = tile_shape
    ramp = max(1, ramp)
    wy = xp.minimum(xp.arange(1, h + 1), xp.arange(h, 0, -1)).astype(xp.float32)
    wx = xp.minimum(xp.arange(1, w + 1), xp.arange(w, 0, -1)).astype(xp.float32)
    return xp.clip(wy / ramp, 0, 1)[:, None] * xp.clip(wx / ramp, 0, 1)[None, :]


def blend(tiles, model: StitchModel, ramp: int | None = None):
    """Mosaic of one plane: tiles placed at the model's positions, overlaps feathered.

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
    for tile, (y, x) in zip(itertools.chain([first], tiles), model.placement):
        acc[y:y + h, x:x + w] += tile.astype(xp.float32) * weights
        wsum[y:y + h, x:x + w] += weights
    xp.maximum(wsum, 1e-12, out=wsum)     # where no tile reaches, acc is 0 and stays 0
    acc /= wsum
    return acc
