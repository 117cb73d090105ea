"""Extended depth of field on the NumPy/CuPy seam.

Focus measure: local variance in a (2 radius + 1)^2 window per plane. Per pixel the
sharpest plane is refined to a fractional index by a parabola through its neighbours;
that focus-index *map* (never the image) is smoothed by a Gaussian weighted by focus
strength; the output interpolates linearly between the two planes around the index.

Quality gate: planes with more than 10 % zero pixels or more than 5 % saturated pixels
are dropped; fewer than 3 usable planes is an error naming the planes.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import xp as xpmod

MAX_ZERO_FRACTION = 0.10
MAX_SATURATED_FRACTION = 0.05
MIN_PLANES = 3


class EDFError(ValueError):
    """Too few usable planes; the message names them and why."""


@dataclass
class EDFResult:
    image: object            # YX float32
    focus_index: object      # YX float32, index into the original stack
    kept_planes: list[int]   # 0-based planes used


def plane_stats(stack, saturation_level: float | None) -> list[dict]:
    """Zero and saturated fractions per plane of a recorded ZYX stack (host or device)."""
    n = stack.shape[1] * stack.shape[2]
    return [{"zero_fraction": float((stack[z] == 0).sum()) / n,
             "saturated_fraction": float((stack[z] >= saturation_level).sum()) / n if saturation_level else 0.0}
            for z in range(stack.shape[0])]


def quality_gate(stats: list[dict], label: str = "") -> tuple[list[int], dict[int, str]]:
    """Planes (0-based) that pass, from what the camera recorded in each (``plane_stats``)."""
    kept, dropped = [], {}
    for z, st in enumerate(stats):
        zeros, sat = st["zero_fraction"], st["saturated_fraction"]
        if zeros > MAX_ZERO_FRACTION:
            dropped[z] = f"{zeros:.0%} zero pixels"
        elif sat > MAX_SATURATED_FRACTION:
            dropped[z] = f"{sat:.0%} saturated pixels"
        else:
            kept.append(z)
    if len(kept) < MIN_PLANES:
        why = "; ".join(f"Z{z + 1:03d}: {r}" for z, r in dropped.items())
        raise EDFError(f"{label}only {len(kept)} of {len(stats)} z-planes usable (need {MIN_PLANES}): {why}")
    return kept, dropped


def local_variance(plane, radius: int):
    """Local variance of one YX plane in a (2 radius + 1)^2 window."""
    xp = xpmod.array_module(plane)
    ndi = xpmod.ndimage(xp)
    p = plane.astype(xp.float32)
    size = 2 * radius + 1
    mean = ndi.uniform_filter(p, size=size, mode="reflect")
    sq = ndi.uniform_filter(p * p, size=size, mode="reflect")
    return xp.maximum(sq - mean * mean, 0)


def extended_depth_of_field(stack, radius: int = 3, sigma: float = 4.0, kept: list[int] | None = None) -> EDFResult:
    """EDF of a ZYX stack (host or device) using planes ``kept`` (default: all).

    The focus measure is computed plane by plane, keeping per pixel only the best plane and
    its neighbours' focus, so memory stays near one stack plus a few planes.
    """
    xp = xpmod.array_module(stack)
    ndi = xpmod.ndimage(xp)
    kept = list(range(stack.shape[0])) if kept is None else list(kept)
    nz = len(kept)
    best = f0 = fm = fp = prev = None
    for i, z in enumerate(kept):
        f = local_variance(xp.asarray(stack[z]), radius)
        if best is None:
            best = xp.zeros(f.shape, xp.int64)
            f0, fm, fp = f.copy(), f.copy(), f.copy()
        else:
            just_after = best == i - 1
            fp = xp.where(just_after, f, fp)                # focus one plane after the best so far
            better = f > f0
            fm = xp.where(better, prev, fm)
            fp = xp.where(better, f, fp)
            f0 = xp.where(better, f, f0)
            best = xp.where(better, i, best)
        prev = f
    denom = fm - 2 * f0 + fp
    frac = xp.where(denom < 0, 0.5 * (fm - fp) / xp.where(denom < 0, denom, -1), 0)
    frac = xp.where((best == 0) | (best == nz - 1), 0, xp.clip(frac, -0.5, 0.5))
    index = best.astype(xp.float32) + frac.astype(xp.float32)
    if sigma > 0:
        weight = f0 + max(1e-6 * float(f0.mean()), 1e-12)
        index = ndi.gaussian_filter(index * weight, sigma) / ndi.gaussian_filter(weight, sigma)
    index = xp.clip(index, 0, nz - 1)
    lo = xp.floor(index).astype(xp.int64)
    hi = xp.minimum(lo + 1, nz - 1)
    t = (index - lo).astype(xp.float32)
    image = xp.zeros(index.shape, xp.float32)
    for i, z in enumerate(kept):                             # one plane at a time
        plane = xp.asarray(stack[z], dtype=xp.float32)
        image += xp.where(lo == i, (1 - t) * plane, 0) + xp.where(hi == i, t * plane, 0)
    kept_arr = xp.asarray(kept, dtype=xp.float32)
    # map the fractional index among kept planes back to the original plane numbering
    orig = xp.take(kept_arr, lo) * (1 - t) + xp.take(kept_arr, hi) * t
    return EDFResult(image=image, focus_index=orig.astype(xp.float32), kept_planes=kept)


def max_projection(stack):
    xp = xpmod.array_module(stack)
    return xp.asarray(stack).max(axis=0).astype(xp.float32)
