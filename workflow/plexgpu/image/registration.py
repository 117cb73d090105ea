"""Cross-cycle registration on the NumPy/CuPy seam: the translation of each cycle's
reference-channel EDF to the reference cycle (whitened, windowed phase correlation,
sub-pixel peak), applied to every channel of that cycle.

The shift is applied at its sub-pixel value (cubic convolution). A peak below the
reliability threshold (the extreme-value bound of a noise-only correlation surface) or an
ambiguous one is an error naming the cycle: a cycle that cannot be registered is never
copied unregistered.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import xp as xpmod
from .phasecorr import phase_correlation
from .subpixel import shift_image

MAX_AMBIGUITY = 0.8


class RegistrationError(RuntimeError):
    """A cycle that cannot be registered reliably; the message names it."""


@dataclass(frozen=True)
class Shift:
    cycle: str
    dy: float          # moving[y, x] ~ reference[y - dy, x - dx]
    dx: float
    significance: float
    threshold: float


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
