"""Widefield point-spread functions computed from the optics, sampled on the image's
own grid (pixel size, z step) and normalised to sum 1.

* ``born_wolf``: a focused spherical wave in a medium matching the immersion (scalar,
  non-paraxial defocus phase ``k z sqrt(n^2 - (NA rho)^2)``).
* ``gibson_lanni``: adds the aberration of imaging at depth ``p`` into a sample whose
  refractive index differs from the immersion's (scalar; coverslip as designed):
  ``k p (sqrt(ns^2 - (NA rho)^2) - sqrt(ni^2 - (NA rho)^2))``.

Each pixel value integrates the PSF over the pixel area (supersampled), so a PSF can
never be sampled on a finer grid than the image it deconvolves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

N_RHO = 600            # Gauss-Legendre nodes over the pupil radius
SUPERSAMPLE = 3        # sub-samples per pixel and axis
MAX_HALF_XY = 64       # lateral half size cap (px)


@dataclass(frozen=True)
class Optics:
    pixel_size_um: float
    z_step_um: float
    na: float
    immersion_index: float
    sample_index: float
    emission_nm: float
    model: str = "born_wolf"
    depth_um: float = 0.0      # focal depth into the sample (gibson_lanni)

    def __post_init__(self):
        if self.model not in ("born_wolf", "gibson_lanni"):
            raise ValueError(f"deconvolution.psf_model must be born_wolf or gibson_lanni, not {self.model!r}")
        if self.na >= self.immersion_index:
            raise ValueError(f"optics.na = {self.na} must be below optics.immersion_index = {self.immersion_index}")


def _pupil_phase(o: Optics, z_um: np.ndarray, rho: np.ndarray) -> np.ndarray:
    k = 2 * np.pi / (o.emission_nm / 1000.0)
    s = o.na * rho
    ni = o.immersion_index
    phase = k * z_um[:, None] * np.sqrt(ni ** 2 - s ** 2)[None, :]
    if o.model == "gibson_lanni" and o.depth_um:
        ns = o.sample_index
        mismatch = np.sqrt(np.maximum(ns ** 2 - s ** 2, 0)) - np.sqrt(ni ** 2 - s ** 2)
        phase = phase + k * o.depth_um * mismatch[None, :]
    return phase


def radial_profile(o: Optics, r_um: np.ndarray, z_um: np.ndarray) -> np.ndarray:
    """Unnormalised intensity PSF on a (z, r) grid in µm."""
    x, wts = np.polynomial.legendre.leggauss(N_RHO)
    rho = 0.5 * (x + 1)
    wts = 0.5 * wts
    k = 2 * np.pi / (o.emission_nm / 1000.0)
    bessel = special.j0(k * o.na * r_um[:, None] * rho[None, :])          # (R, P)
    pupil = np.exp(1j * _pupil_phase(o, np.asarray(z_um, float), rho)) * (rho * wts)[None, :]  # (Z, P)
    field = pupil @ bessel.T                                             # (Z, R)
    return np.abs(field) ** 2


def default_half_size(o: Optics, n_planes: int) -> tuple[int, int]:
    """(half z planes, half xy px): the stack's depth, and the defocus cone it spreads into."""
    half_z = max(1, n_planes - 1)
    theta = math.asin(o.na / o.immersion_index)
    reach_um = half_z * o.z_step_um * math.tan(theta) + 3 * 0.61 * (o.emission_nm / 1000.0) / o.na
    return half_z, int(min(MAX_HALF_XY, math.ceil(reach_um / o.pixel_size_um) + 2))


def psf(o: Optics, half_z: int, half_xy: int) -> np.ndarray:
    """ZYX PSF of shape (2 half_z + 1, 2 half_xy + 1, 2 half_xy + 1), pixel-integrated, sum 1."""
    z_um = np.arange(-half_z, half_z + 1) * o.z_step_um
    sub = (np.arange(SUPERSAMPLE) + 0.5) / SUPERSAMPLE - 0.5
    coords = (np.arange(-half_xy, half_xy + 1)[:, None] + sub[None, :]).ravel() * o.pixel_size_um
    rr = np.hypot(coords[:, None], coords[None, :])
    r_max = float(rr.max())
    r_grid = np.linspace(0, r_max, int(r_max / (o.pixel_size_um / (4 * SUPERSAMPLE))) + 2)
    prof = radial_profile(o, r_grid, z_um)                                # (Z, R)
    n = 2 * half_xy + 1
    out = np.empty((len(z_um), n, n), np.float64)
    for i in range(len(z_um)):
        img = np.interp(rr, r_grid, prof[i])
        out[i] = img.reshape(n, SUPERSAMPLE, n, SUPERSAMPLE).mean(axis=(1, 3))
    out /= out.sum()
    return out.astype(np.float32)


def fwhm(profile: np.ndarray, spacing: float) -> float:
    """Full width at half maximum of a symmetric 1-D profile centred at index 0 or at its middle."""
    p = np.asarray(profile, float)
    i0 = int(np.argmax(p))
    half = p[i0] / 2
    right = p[i0:]
    j = int(np.argmax(right < half))
    if j == 0:
        return float("nan")
    # linear interpolation between samples j-1 and j
    x = (j - 1) + (right[j - 1] - half) / (right[j - 1] - right[j])
    return 2 * x * spacing
