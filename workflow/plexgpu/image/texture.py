"""How much structure an image holds above its own noise, on the NumPy/CuPy seam.

Stitching and QC ask one question of a tile, an overlap strip or a channel: is there anything a
correlation could lock onto, or a segmentation could measure? Two numbers answer it:

- ``noise``: the pixel noise (photon + read noise), 1.4826 x the median absolute difference of
  horizontal neighbours / sqrt(2). Structure at the scale of cells barely changes from one pixel
  to the next, so the median difference sees the noise, not the tissue.
- ``snr``: the standard deviation of the image's BLOCK x BLOCK block means, less what the noise
  contributes to them (noise / BLOCK) and less a fitted plane (illumination that flat-field
  correction left: a ramp, not structure), in units of that block-mean noise. A bare slide or a
  blank frame holds only noise: ``snr`` near 0. A nucleus 3 noise sigmas above its surroundings
  over a few blocks already reaches several units.

``light`` is the mean (counts above the camera offset on corrected tiles): a blank frame holds
less light than its own pixel noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import xp as xpmod
from .robust import MAD_TO_STD

BLOCK = 4                 # px: block side, below the size of a nucleus (20x: ~25 px), above the pixel
MIN_TEXTURE_SNR = 3.0     # structure this many block-mean noise sigmas above nothing: texture


@dataclass(frozen=True)
class Texture:
    light: float          # mean intensity
    noise: float          # pixel noise sigma (same units)
    snr: float            # structure of the block means over their noise (0: noise only)

    @property
    def textured(self) -> bool:
        return self.snr >= MIN_TEXTURE_SNR

    @property
    def lit(self) -> bool:
        """More light than one pixel-noise sigma: not a blank frame."""
        return self.light > self.noise


def measure(img) -> Texture:
    """The light, noise and structure of a 2-D image (host or device array): one transfer of the
    block means back to the host."""
    xp = xpmod.array_module(img)
    a = img.astype(xp.float32)
    h, w = (a.shape[0] // BLOCK) * BLOCK, (a.shape[1] // BLOCK) * BLOCK
    if h < 2 * BLOCK or w < 2 * BLOCK:
        return Texture(float(a.mean()), 0.0, 0.0)
    diff = xp.abs(a[:, 1:] - a[:, :-1])
    blocks = a[:h, :w].reshape(h // BLOCK, BLOCK, w // BLOCK, BLOCK).mean(axis=(1, 3))
    packed = xpmod.to_host(xp.stack([xp.median(diff), a.mean()]))
    noise, light = MAD_TO_STD * float(packed[0]) / np.sqrt(2.0), float(packed[1])
    b = xpmod.to_host(blocks).astype(np.float64)
    yy, xx = np.mgrid[:b.shape[0], :b.shape[1]]
    design = np.stack([np.ones(b.size), yy.ravel(), xx.ravel()], axis=1)
    coef = np.linalg.lstsq(design, b.ravel(), rcond=None)[0]
    resid = b.ravel() - design @ coef
    block_noise = noise / BLOCK
    structure = np.sqrt(max(float(np.mean(resid ** 2)) - block_noise ** 2, 0.0))
    return Texture(light, noise, structure / block_noise if block_noise > 0 else (np.inf if structure else 0.0))
