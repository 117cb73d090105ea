"""Robust statistics the image algorithms share, on host or device arrays (the ``xp`` seam)."""

from __future__ import annotations

from .. import xp as xpmod

MAD_TO_STD = 1.4826     # a normal distribution's standard deviation per median absolute deviation


def robust_std(values, about_zero: bool = False) -> float:
    """The spread of ``values`` as a normal distribution's standard deviation, unmoved by outliers: MAD_TO_STD x the
    median absolute deviation from their median, or from 0 (``about_zero``: residuals of a fit, or values already
    centred; no median taken, nothing subtracted)."""
    xp = xpmod.array_module(values)
    deviation = values if about_zero else values - xp.median(values)
    return MAD_TO_STD * float(xp.median(xp.abs(deviation)))
