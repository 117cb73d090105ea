"""Robust statistics the image algorithms share, on host or device arrays (the ``xp`` seam)."""

from __future__ import annotations

from .. import xp as xpmod

MAD_TO_STD = 1.4826     # a normal distribution's standard deviation per median absolute deviation


def robust_std(values, centre=None) -> float:
    """The spread of ``values`` as a normal distribution's standard deviation, unmoved by outliers: MAD_TO_STD x the
    median absolute deviation from ``centre`` (default: their median; 0 for residuals of a fit)."""
    xp = xpmod.array_module(values)
    if centre is None:
        centre = xp.median(values)
    return MAD_TO_STD * float(xp.median(xp.abs(values - centre)))
