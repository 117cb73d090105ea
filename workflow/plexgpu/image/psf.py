"""Widefield point-spread functions computed from the optics, sampled on the image's
own grid (pixel size, z step) and normalised to sum 1.

* ``born_wolf``: a focused spherical wave in a medium matching the immersion (scalar,
  non-paraxial defocus phase ``k z sqrt(n^2 - (NA rho)^2)``).
* ``gibson_lanni``: adds the aberration of imaging at depth ``p`` into a sample whose
  refractive index differs from the immersion's (scalar; coverslip as designed):
  ``k p (sqrt(ns^2 - (NA rho)^2) - sqrt(ni^2 - (NA rho)^2))``.

Each pixel value integrates the PSF over the pixel area (supersampled), so a PSF can
never be sampled on a finer grid than the image it deconvolves. The lateral extent is a disk
(the box's inscribed circle, with a cosine edge over its outer EDGE_FRACTION), so defocus
rings are cut round, not square, where the box is smaller than the defocus cone.

``measured``: a PSF the user imaged (a bead z-stack), resampled to the data's grid: its
background (the median of the stack's outer shell) taken off, negatives set to 0, its peak
moved to the centre, integrated over the data's voxels where it was sampled finer, summed to 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

N_RHO = 600            # Gauss-Legendre nodes over the pupil radius
SUPERSAMPLE = 3        # sub-samples per pixel and axis
MAX_HALF_XY = 64       # lateral half size cap (px)
EDGE_FRACTION = 0.15   # the disk's outer part where the PSF is tapered to 0 (cosine)


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
    reach_um = half_z * o.z_step_um * math.tan(theta) + _airy_reach_um(o)
    return half_z, int(min(MAX_HALF_XY, math.ceil(reach_um / o.pixel_size_um) + 2))


def _airy_reach_um(o: Optics) -> float:
    """Three Airy radii: where the in-focus PSF has spread nearly all its light."""
    return 3 * 0.61 * (o.emission_nm / 1000.0) / o.na


def in_focus(kernel: np.ndarray, o: Optics) -> np.ndarray:
    """The PSF's sharpest plane (its highest peak: the best focus, also where a depth aberration or a
    measured bead moves it) as a (1, y, x) kernel, cut to three Airy radii (+2 px) around its centre,
    sum 1: the blur of each plane's in-focus light, what a lateral deconvolution undoes."""
    kernel = np.asarray(kernel, np.float64)
    plane = kernel[int(np.argmax(kernel.max(axis=(1, 2))))]
    half = min(plane.shape[0] // 2, int(math.ceil(_airy_reach_um(o) / o.pixel_size_um)) + 2)
    cy, cx = plane.shape[0] // 2, plane.shape[1] // 2
    plane = plane[cy - half:cy + half + 1, cx - half:cx + half + 1]
    return (plane / plane.sum()).astype(np.float32)[None]


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
    out *= _disk(half_xy)[None]
    out /= out.sum()
    return out.astype(np.float32)


def _disk(half: int) -> np.ndarray:
    """1 inside the box's inscribed circle, a cosine taper to 0 over its outer EDGE_FRACTION, 0 beyond."""
    r = np.hypot(*np.mgrid[-half:half + 1, -half:half + 1]) / max(half + 0.5, 1)
    edge = np.clip((r - (1 - EDGE_FRACTION)) / EDGE_FRACTION, 0, 1)
    return 0.5 * (1 + np.cos(np.pi * edge))


def file_for(decon_cfg: dict, channel: int) -> str | None:
    """The measured PSF of a channel from deconvolution.psf_file (one file, or {channel: path})."""
    f = decon_cfg.get("psf_file")
    return f.get(str(channel)) if isinstance(f, dict) else f


class PSFError(ValueError):
    """A measured PSF that cannot be used; the message names the file and the config key."""


def measured(path, voxel_um: tuple[float, float, float] | None, z_step_um: float, pixel_size_um: float,
             max_planes: int | None = None) -> np.ndarray:
    """A measured PSF (TIFF z-stack) on the data's grid (``z_step_um``, ``pixel_size_um``), sum 1,
    odd-sized with its peak at the centre. ``voxel_um`` (z, y, x) of the file; None: from its OME
    metadata (PhysicalSizeZ/Y/X). ``max_planes``: cut to at most this many planes (2 nz - 1)."""
    import tifffile
    from scipy import ndimage

    key = "config key deconvolution.psf_file"
    try:
        with tifffile.TiffFile(path) as tif:
            data = tif.asarray().astype(np.float64)
            ome = tif.ome_metadata
    except Exception as exc:  # tifffile raises several types for a broken file
        raise PSFError(f"{key}: {path} cannot be read as a TIFF ({exc})") from None
    data = np.squeeze(data)
    if data.ndim != 3 or min(data.shape) < 3:
        raise PSFError(f"{key}: {path} must be a z-stack (Z, Y, X) of at least 3 planes, found shape {data.shape}")
    if voxel_um is None:
        voxel_um = _ome_voxel(ome)
        if voxel_um is None:
            raise PSFError(f"{key}: {path} has no PhysicalSizeZ/Y/X in OME metadata; give "
                           "deconvolution.psf_voxel_um: [z, y, x]")
    shell = np.concatenate([data[[0, -1]].ravel(), data[:, [0, -1]].ravel(), data[:, :, [0, -1]].ravel()])
    data = np.maximum(data - np.median(shell), 0)
    if data.sum() <= 0:
        raise PSFError(f"{key}: {path} holds no light above its background")
    # to the data's grid: integrate over a data voxel where the PSF is finer, then interpolate
    factor = np.array([voxel_um[0] / z_step_um, voxel_um[1] / pixel_size_um, voxel_um[2] / pixel_size_um])
    box = tuple(max(1, int(round(1 / f))) for f in factor)
    if box != (1, 1, 1):
        data = ndimage.uniform_filter(data, size=box, mode="constant")
    if not np.allclose(factor, 1, atol=1e-3):
        data = np.maximum(ndimage.zoom(data, factor, order=1, grid_mode=True, mode="grid-constant"), 0)
    peak = np.unravel_index(int(np.argmax(ndimage.gaussian_filter(data, 1))), data.shape)
    half = [min(p, n - 1 - p) for p, n in zip(peak, data.shape)]
    if max_planes is not None:
        half[0] = min(half[0], (max_planes - 1) // 2)
    out = data[tuple(slice(p - h, p + h + 1) for p, h in zip(peak, half))]
    return (out / out.sum()).astype(np.float32)


def _ome_voxel(ome: str | None) -> tuple[float, float, float] | None:
    import re

    if not ome:
        return None
    sizes = {k: re.search(rf'PhysicalSize{k}="([0-9.eE+-]+)"', ome) for k in "ZYX"}
    if not all(sizes.values()):
        return None
    return tuple(float(sizes[k].group(1)) for k in "ZYX")


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
