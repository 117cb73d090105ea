"""A seeded CODEX-like synthetic dataset with ground truth.

Per cycle the same specimen (shifted by a per-cycle offset) is imaged as a grid of
tiles x z-planes x channels:

* specimen: nuclei-like blobs with pixel-level texture; channel 1 is a nuclear
  stain present in every cycle, the other channels label a random subset of
  nuclei (sparse markers where ``sparse_fraction`` is small);
* depth: the specimen is a thin sheet at an in-focus depth that varies smoothly
  across the field, between recorded planes; the z-stack is that sheet imaged through
  the widefield PSF of the optics at each pixel's own defocus (``plexgpu.image.psf``, the
  same model deconvolution uses), so defocus blur is physical;
* acquisition: true stage positions = nominal grid + Gaussian jitter (sub-pixel); each
  cycle's specimen shifted by a sub-pixel offset; the camera may be rotated to the stage
  (tiles are sampled from the specimen by cubic-spline interpolation); per-(channel, z)
  smooth flatfield (vignetting of a chosen depth) and darkfield (camera offset with a
  gradient); Poisson + read noise; uint16.

Same arguments -> identical bytes. Ground truth is written to ``<out>/truth/``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy import fft as sp_fft
from scipy import ndimage, signal

from . import psf as psfmod
from ..io.raw import grid_layout, tile_filename
from ..io.tiff import write_text_atomic, write_tiff

DEPTH_LEVELS = 8   # depth levels per z step the specimen is placed on (EDF fidelity: 16 gives the same to 1e-5)


@dataclass(frozen=True)
class SynthSpec:
    cycles: int = 3
    rows: int = 3
    cols: int = 3
    tile: tuple[int, int] = (256, 256)
    z_planes: int = 5
    channels: int = 2
    overlap: float = 0.3
    order: str = "snake"
    region: int = 1
    seed: int = 0
    jitter_px: float = 2.0         # stage jitter: std of a Gaussian per tile and axis (px), cut at 2 std
    cycle_shift_px: float = 8.0    # each cycle's specimen shift: uniform in [-this, this] per axis (px)
    rotation_deg: float = 0.0      # camera rotated to the stage by this angle
    vignetting: float = 0.35       # light lost at the flatfield's darkest corner relative to its peak
    dark_offset: float = 100.0     # camera offset (counts) the darkfield is built around
    nuclei_density: float = 1.0    # nuclei per area relative to the default (3: a dense stain, no empty pixels)
    na: float = 0.75
    immersion_index: float = 1.0
    sample_index: float = 1.33
    read_noise: float = 3.0
    poisson: bool = True
    sparse_fraction: float = 0.08
    tissue_fraction: float = 0.8
    blank_tiles: tuple[int, ...] = ()
    hot_pixels: float = 0.0        # fraction of sensor pixels that are hot: the same positions in every tile,
                                   # channel and cycle (one camera), each adding a fixed 300-4000 counts
    thickness_um: float = 0.0      # 0: a thin sheet; else each pixel a uniform slab this deep around its depth
    pixel_size_um: float = 0.377
    z_step_um: float = 1.5
    markers: tuple[str, ...] = field(default=())   # a marker named Blank... shows autofluorescence only
    brightness: float = 1.0        # scales every channel's counts (0.1: a dim marker at low counts)
    stray_light: float = 0.0       # counts of light fixed to the sensor, not shaded (stray excitation, a reflection):
                                   # this many at one corner of the sensor, falling off across it; every tile

    def __post_init__(self):
        if self.thickness_um < 0:
            raise ValueError(f"SynthSpec.thickness_um must be >= 0 (0: a thin sheet), not {self.thickness_um}")
        if not 0 <= self.vignetting < 1:
            raise ValueError(f"SynthSpec.vignetting must be in [0, 1), not {self.vignetting}")
        if self.stray_light < 0:
            raise ValueError(f"SynthSpec.stray_light must be >= 0 counts, not {self.stray_light}")
        if not 0 <= self.hot_pixels < 0.5:
            raise ValueError(f"SynthSpec.hot_pixels must be a fraction in [0, 0.5), not {self.hot_pixels}")
        if self.jitter_px < 0 or self.cycle_shift_px < 0 or self.dark_offset < 0 or self.nuclei_density <= 0 \
                or self.brightness <= 0:
            raise ValueError("SynthSpec: jitter_px, cycle_shift_px and dark_offset must be >= 0, nuclei_density and "
                             "brightness > 0")

    @property
    def step(self) -> tuple[int, int]:
        h, w = self.tile
        return int(round(h * (1 - self.overlap))), int(round(w * (1 - self.overlap)))

    @property
    def margin(self) -> int:
        """Border of the field around the nominal grid: the largest jitter, the rotated tile's corners."""
        h, w = self.tile
        turn = abs(math.sin(math.radians(self.rotation_deg))) * max(h, w) / 2
        return int(math.ceil(2 * self.jitter_px + turn)) + 3

    @property
    def frame_shape(self) -> tuple[int, int]:
        """Shape of one cycle's field (the area the stage can reach)."""
        (sy, sx), (h, w) = self.step, self.tile
        return ((self.rows - 1) * sy + h + 2 * self.margin, (self.cols - 1) * sx + w + 2 * self.margin)

    def marker_names(self) -> list[str]:
        if self.markers:
            return list(self.markers)
        names = []
        for c in range(1, self.cycles + 1):
            names += ["DAPI"] + [f"M{c:02d}{ch}" for ch in range(2, self.channels + 1)]
        return names


class SynthDataset:
    """Ground truth of a synthetic dataset, computed deterministically from a SynthSpec."""

    def __init__(self, spec: SynthSpec):
        self.spec = spec
        self._stacks: dict = {}
        self._psfs: dict = {}
        rng = np.random.default_rng(spec.seed)
        fy, fx = spec.frame_shape
        s = int(math.ceil(spec.cycle_shift_px)) + 2
        self.canvas_margin = s
        self.canvas_shape = (fy + 2 * s, fx + 2 * s)
        # per-cycle specimen offset of the frame inside the canvas (cycle 1 = no shift), sub-pixel
        self.cycle_shifts = [(0.0, 0.0)] + [tuple(float(v) for v in rng.uniform(-1, 1, 2) * spec.cycle_shift_px)
                                            for _ in range(spec.cycles - 1)]
        (sy, sx), m, j = spec.step, spec.margin, spec.jitter_px
        self.stage = []  # per cycle: (y, x) of each tile's top-left (acquisition order) in the frame, specimen axes
        layout = grid_layout(spec.rows, spec.cols, spec.order)
        for _ in range(spec.cycles):
            jit = np.clip(rng.normal(0, 1, size=(len(layout), 2)), -2, 2) * j
            self.stage.append([(m + r * sy + float(jy), m + c * sx + float(jx))
                               for (r, c), (jy, jx) in zip(layout, jit)])
        # what stitching should find: each tile's top-left in the camera's axes (the stage positions
        # turned by the camera rotation; identical to them when the camera is aligned)
        rot = self.rotation().T
        self.positions = [[tuple(float(v) for v in rot @ p) for p in pos] for pos in self.stage]
        self._nuclei_seed = int(rng.integers(2**31))
        self._marker_seeds = rng.integers(2**31, size=(spec.cycles, spec.channels))
        self._noise_seed = int(rng.integers(2**31))
        self._tissue_seed = int(rng.integers(2**31))
        self.nuclei, self.nucleus_labels = self._make_nuclei()
        self.depth = self._make_depth()
        self.blank_mask = self._make_blank_mask()
        self.tissue = self._make_tissue()

    # ------------------------------------------------------------------ specimen
    def _make_nuclei(self):
        rng = np.random.default_rng(self._nuclei_seed)
        shape = self.canvas_shape
        n = max(8, int(shape[0] * shape[1] / 250 * self.spec.nuclei_density))
        ys = rng.uniform(0, shape[0], n)
        xs = rng.uniform(0, shape[1], n)
        radius = rng.uniform(3.0, 6.0, n)
        amp = rng.uniform(0.5, 1.0, n)
        yy, xx = np.mgrid[0:shape[0], 0:shape[1]]
        labels = np.zeros(shape, np.int32)
        img = np.zeros(shape, np.float32)
        for i in range(n):
            y0, y1 = int(max(0, ys[i] - 3 * radius[i])), int(min(shape[0], ys[i] + 3 * radius[i] + 1))
            x0, x1 = int(max(0, xs[i] - 3 * radius[i])), int(min(shape[1], xs[i] + 3 * radius[i] + 1))
            d2 = (yy[y0:y1, x0:x1] - ys[i]) ** 2 + (xx[y0:y1, x0:x1] - xs[i]) ** 2
            blob = amp[i] / (1.0 + np.exp((np.sqrt(d2) - radius[i]) / 0.8))
            sub = img[y0:y1, x0:x1]
            take = blob > sub
            sub[take] = blob[take]
            labels[y0:y1, x0:x1][take & (blob > 0.5 * amp[i])] = i + 1
        texture = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), 0.8)
        texture /= texture.std()
        img = np.clip(img * (1.0 + 0.25 * texture), 0, None)
        # tissue autofluorescence: covers the whole field, smooth with pixel-level texture
        smooth = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), 25.0)
        smooth = (smooth - smooth.min()) / max(float(np.ptp(smooth)), 1e-6)
        self.autofluorescence = (0.06 + 0.10 * smooth) * (1.0 + 0.3 * np.clip(texture, -3, 3))
        return img.astype(np.float32), labels

    def _make_depth(self):
        """In-focus depth (z index, 0-based, fractional) across the canvas."""
        nz = self.spec.z_planes
        yy, xx = np.mgrid[0:self.canvas_shape[0], 0:self.canvas_shape[1]].astype(np.float32)
        u, v = yy / self.canvas_shape[0], xx / self.canvas_shape[1]
        centre = (nz - 1) / 2.0
        span = max(0.0, (nz - 3) / 2.0)  # keep a plane on either side of focus
        d = centre + span * (0.6 * (v - 0.5) * 2 * 0.8 + 0.4 * np.sin(2 * np.pi * (u + 0.3 * v)))
        return np.clip(d, 1.0 if nz >= 3 else 0.0, max(nz - 2.0, 0.0)).astype(np.float32)

    def _make_tissue(self):
        """Soft mask of the tissue section: ~80 % of the field, bare slide elsewhere."""
        if self.spec.tissue_fraction >= 1:
            return np.ones(self.canvas_shape, np.float32)
        rng = np.random.default_rng(self._tissue_seed)
        field = ndimage.gaussian_filter(rng.standard_normal(self.canvas_shape).astype(np.float32),
                                        max(self.canvas_shape) / 12)
        cut = np.quantile(field, 1 - self.spec.tissue_fraction)
        return np.clip((field - cut) / (0.05 * float(np.ptp(field))) + 0.5, 0, 1).astype(np.float32)

    def _make_blank_mask(self):
        mask = np.zeros(self.canvas_shape, bool)
        if not self.spec.blank_tiles:
            return mask
        (sy, sx), (h, w), m, s = self.spec.step, self.spec.tile, self.spec.margin, self.canvas_margin
        layout = grid_layout(self.spec.rows, self.spec.cols, self.spec.order)
        pad = m + s
        for t in self.spec.blank_tiles:
            r, c = layout[t - 1]
            y0, x0 = s + m + r * sy - pad, s + m + c * sx - pad
            mask[max(0, y0):y0 + h + 2 * pad, max(0, x0):x0 + w + 2 * pad] = True
        return mask

    def canvas_specimen(self, cycle: int, channel: int) -> np.ndarray:
        """Sharp specimen of (cycle, channel) on the whole canvas, in [0, ~1.5] (cycle, channel from 1)."""
        spec = self.spec
        if channel == 1:
            img = self.nuclei
        else:
            rng = np.random.default_rng(int(self._marker_seeds[cycle - 1, channel - 1]))
            n = int(self.nucleus_labels.max())
            frac = spec.sparse_fraction if channel % 2 == 0 else 0.4
            if self.spec.marker_names()[(cycle - 1) * spec.channels + channel - 1].lower().startswith("blank"):
                frac = 0.0                                  # a Blank cycle: the tissue's own light only
            keep = np.concatenate([[False], rng.random(n) < frac])
            gain = np.concatenate([[0.0], rng.uniform(0.4, 1.0, n)]).astype(np.float32)
            lab = self.nucleus_labels
            grown = ndimage.grey_dilation(np.where(keep[lab], lab, 0), size=5)
            img = self.nuclei * np.where(grown > 0, gain[grown], 0.0).astype(np.float32)
            img = ndimage.gaussian_filter(img, 0.7)
        img = img + self.autofluorescence * (1.0 if channel == 1 else 0.7)
        return np.where(self.blank_mask, 0.0, img * self.tissue).astype(np.float32)

    def specimen(self, cycle: int, channel: int) -> np.ndarray:
        """Sharp specimen of (cycle, channel) in the cycle's frame."""
        return self.frame(cycle, self.canvas_specimen(cycle, channel))

    def frame_origin(self, cycle: int) -> tuple[float, float]:
        """Where the cycle's frame starts on the canvas (px, sub-pixel)."""
        dy, dx = self.cycle_shifts[cycle - 1]
        return self.canvas_margin + dy, self.canvas_margin + dx

    def frame(self, cycle: int, canvas: np.ndarray) -> np.ndarray:
        """The cycle's frame cut from a canvas-sized image (YX, or ZYX plane by plane): cubic-spline
        interpolation at a sub-pixel shift, an exact crop at a whole-pixel one."""
        if canvas.ndim == 3:
            return np.stack([self.frame(cycle, p) for p in canvas])
        oy, ox = self.frame_origin(cycle)
        fy, fx = self.spec.frame_shape
        if float(oy).is_integer() and float(ox).is_integer():
            return canvas[int(oy):int(oy) + fy, int(ox):int(ox) + fx]
        return ndimage.affine_transform(canvas, np.eye(2), offset=(oy, ox), output_shape=(fy, fx), order=3,
                                        mode="mirror").astype(np.float32)

    def depth_map(self, cycle: int) -> np.ndarray:
        return self.frame(cycle, self.depth)

    def optics(self, channel: int) -> psfmod.Optics:
        from ..experiment import DEFAULT_EMISSION_NM

        sp = self.spec
        return psfmod.Optics(pixel_size_um=sp.pixel_size_um, z_step_um=sp.z_step_um, na=sp.na,
                             immersion_index=sp.immersion_index, sample_index=sp.sample_index,
                             emission_nm=DEFAULT_EMISSION_NM.get(channel, 520.0))

    def psf(self, channel: int) -> np.ndarray:
        if channel not in self._psfs:
            o = self.optics(channel)
            self._psfs[channel] = psfmod.psf(o, *psfmod.default_half_size(o, self.spec.z_planes))
        return self._psfs[channel]

    def in_focus(self, cycle: int, channel: int, frame_of: int | None = None) -> np.ndarray:
        """The specimen as a perfectly focused widefield image would show it (in-focus PSF slice), in the
        frame of cycle ``frame_of`` (default: its own; another cycle's: as registered onto that one)."""
        p = self.psf(channel)
        sl = p[p.shape[0] // 2]
        sharp = self.canvas_specimen(cycle, channel)
        pad = sl.shape[0] // 2
        big = np.pad(sharp, pad, mode="reflect")
        blurred = signal.fftconvolve(big, sl / sl.sum(), mode="same")[pad:-pad, pad:-pad].astype(np.float32)
        return self.frame(cycle if frame_of is None else frame_of, blurred)

    def fine_psf(self, channel: int) -> np.ndarray:
        """The channel's PSF on a z grid ``DEPTH_LEVELS`` times finer than the planes, scaled so that
        every ``DEPTH_LEVELS``-th plane equals ``psf(channel)``."""
        key = ("fine", channel)
        if key not in self._psfs:
            p = self.psf(channel)
            hz, hxy = p.shape[0] // 2, p.shape[1] // 2
            o = self.optics(channel)
            fine = psfmod.psf(replace(o, z_step_um=o.z_step_um / DEPTH_LEVELS), hz * DEPTH_LEVELS, hxy)
            fine *= p[hz].sum() / fine[hz * DEPTH_LEVELS].sum()
            self._psfs[key] = fine
        return self._psfs[key]

    def canvas_stack(self, cycle: int, channel: int) -> np.ndarray:
        """Clean (no shading, no noise) z-stack of (cycle, channel) on the canvas, float32 ZYX: the
        specimen (a sheet, or a slab ``thickness_um`` deep) at its fractional depth imaged through
        the 3-D widefield PSF.

        Each pixel of the sheet sits at its own depth, between recorded planes: the sheet is put on a
        z grid ``DEPTH_LEVELS`` times finer than the planes (split linearly between the two nearest
        levels) and every recorded plane sums each level convolved with the PSF at that level's
        defocus (``image_sheet``)."""
        key = (cycle, channel)
        if key in self._stacks:
            return self._stacks[key]
        out = image_sheet(self.canvas_specimen(cycle, channel), self.depth, self.fine_psf(channel),
                          self.spec.z_planes, self.spec.thickness_um / self.spec.z_step_um)
        out = np.clip(out, 0, None)
        if len(self._stacks) > 8:
            self._stacks.clear()
        self._stacks[key] = out
        return out

    def stack(self, cycle: int, channel: int) -> np.ndarray:
        """The clean z-stack of (cycle, channel) in the cycle's frame (``canvas_stack``, framed)."""
        return self.frame(cycle, self.canvas_stack(cycle, channel))

    # ------------------------------------------------------------------ acquisition
    def amplitude(self, channel: int) -> float:
        """Counts of a unit specimen value in a perfectly focused image."""
        return 3000.0 * self.spec.brightness / channel / self._focus_fraction(channel)

    def _focus_fraction(self, channel: int) -> float:
        p = self.psf(channel)
        return float(p[p.shape[0] // 2].sum())

    def background(self, channel: int) -> float:
        """Signal on bare slide before shading: none; the camera offset is the darkfield."""
        return 0.0

    def flatfield(self, channel: int, z: int) -> np.ndarray:
        """Smooth flatfield of (channel, z), mean 1 (channel and z from 1): a vignetting bump whose
        darkest corner has lost about ``vignetting`` of its peak (a little more or less per plane)."""
        h, w = self.spec.tile
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        cy = h * (0.5 + 0.12 * np.sin(1.3 * channel + 0.4 * z))
        cx = w * (0.5 + 0.12 * np.cos(0.7 * channel + 0.3 * z))
        r2 = ((yy - cy) / h) ** 2 + ((xx - cx) / w) ** 2
        loss = min(0.95, self.spec.vignetting * (0.9 + 0.02 * z + 0.03 * channel))
        f = np.exp(np.log1p(-loss) * r2 / r2.max())
        return (f / f.mean()).astype(np.float32)

    def darkfield(self, channel: int, z: int) -> np.ndarray:
        """Camera offset of (channel, z), as an sCMOS dark frame shows it: about ``dark_offset``
        counts, a gradient across the sensor and a fixed pattern of column offsets (+-2 %). It belongs
        to the camera and its readout mode: the same on every z-plane, a little different per channel."""
        h, w = self.spec.tile
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        off = self.spec.dark_offset
        base = off * (0.8 + 0.1 * channel)
        columns = np.random.default_rng([self.spec.seed, 7]).uniform(-0.02, 0.02, w).astype(np.float32) * off
        return (base + 0.25 * off * (xx / w) + 0.1 * off * (yy / h) + columns[None, :]).astype(np.float32)

    def hot_pixels(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The camera's hot pixels: (y, x, counts added), the same for every tile, channel and cycle."""
        h, w = self.spec.tile
        rng = np.random.default_rng([self.spec.seed, 11])
        n = int(round(self.spec.hot_pixels * h * w))
        flat = rng.choice(h * w, n, replace=False)
        return flat // w, flat % w, rng.uniform(300, 4000, n).astype(np.float32)

    def rotation(self) -> np.ndarray:
        """Camera axes in specimen coordinates: (y, x) of a tile pixel maps to R @ (y, x)."""
        t = math.radians(self.spec.rotation_deg)
        return np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])

    def expected_tiles(self, cycle: int, channel: int, z: int, stack: np.ndarray | None = None):
        """Noise-free tiles (shaded, with darkfield) of one plane, acquisition order, float32.

        Each tile samples the canvas stack at its stage position (sub-pixel) through the camera's
        rotation, by cubic-spline interpolation (exact at whole pixels without rotation)."""
        plane = (stack if stack is not None else self.canvas_stack(cycle, channel))[z - 1]
        signal = self.background(channel) + self.amplitude(channel) * plane
        flat, dark = self.flatfield(channel, z), self.darkfield(channel, z)
        h, w = self.spec.tile
        rot = self.rotation()
        centre = np.array([(h - 1) / 2, (w - 1) / 2])
        oy, ox = self.frame_origin(cycle)
        exact = self.spec.rotation_deg == 0 and all(float(v).is_integer() for p in self.stage[cycle - 1] for v in p) \
            and float(oy).is_integer() and float(ox).is_integer()
        coeffs = None if exact else ndimage.spline_filter(signal, order=3, mode="mirror")
        tiles = []
        for y, x in self.stage[cycle - 1]:
            if exact:
                y0, x0 = int(oy + y), int(ox + x)
                tile = signal[y0:y0 + h, x0:x0 + w]
            else:   # canvas point of tile pixel u: origin + stage + centre + R (u - centre)
                offset = np.array([oy + y, ox + x]) + centre - rot @ centre
                tile = ndimage.affine_transform(coeffs, rot, offset=offset, output_shape=(h, w), order=3,
                                                mode="mirror", prefilter=False)
            tiles.append(tile.astype(np.float32) * flat + self.stray(channel) + dark)
        return tiles

    def stray(self, channel: int) -> np.ndarray:
        """Light fixed to the sensor (``stray_light``): added to every tile at the same sensor place, not shaded
        by the flatfield; brightest at the corner (last row, last column), a little different per channel."""
        h, w = self.spec.tile
        yy, xx = np.mgrid[0:h, 0:w] / np.array([h, w], np.float32).reshape(2, 1, 1)
        return (self.spec.stray_light * (1.1 - 0.1 * channel)
                * np.exp(-((yy - 1) ** 2 + (xx - 1) ** 2) / 0.15)).astype(np.float32)

    def write(self, out: str | Path) -> Path:
        """Write the raw layout, experiment.json, channelNames.txt and truth/ under ``out``."""
        out = Path(out)
        spec = self.spec
        for c in range(1, spec.cycles + 1):
            folder = out / f"cyc{c:03d}_reg{spec.region:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            for ch in range(1, spec.channels + 1):
                stack = self.canvas_stack(c, ch)
                for z in range(1, spec.z_planes + 1):
                    rng = np.random.default_rng([self._noise_seed, c, ch, z])
                    for t, tile in enumerate(self.expected_tiles(c, ch, z, stack), start=1):
                        dark = self.darkfield(ch, z)
                        sig = tile - dark
                        if spec.poisson:
                            sig = rng.poisson(np.clip(sig, 0, None)).astype(np.float32)
                        val = sig + dark
                        if spec.read_noise:
                            val = val + rng.normal(0, spec.read_noise, val.shape).astype(np.float32)
                        if spec.hot_pixels:
                            hy, hx, hv = self.hot_pixels()
                            val[hy, hx] += hv
                        raw = np.clip(np.rint(val), 0, 65535).astype(np.uint16)
                        write_tiff(folder / tile_filename(spec.region, t, z, ch), raw)
        h, w = spec.tile
        experiment = {
            "name": "plexgpu synthetic", "numCycles": spec.cycles, "regionWidth": spec.cols,
            "regionHeight": spec.rows, "tileWidth": w, "tileHeight": h, "tileOverlapX": spec.overlap,
            "tileOverlapY": spec.overlap, "xyResolution": spec.pixel_size_um * 1000.0,
            "zPitch": spec.z_step_um * 1000.0, "numZPlanes": spec.z_planes,
            "channelNames": {"channelNamesArray": self.spec.marker_names()},
        }
        write_text_atomic(out / "experiment.json", json.dumps(experiment, indent=2))
        write_text_atomic(out / "channelNames.txt", "\n".join(self.spec.marker_names()) + "\n")
        self.write_truth(out / "truth")
        return out

    def write_truth(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        spec = self.spec
        truth = {
            "spec": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(spec).items()},
            "cycle_shifts": [list(s) for s in self.cycle_shifts],
            "positions": [[list(p) for p in pos] for pos in self.positions],
            "stage_positions": [[list(p) for p in pos] for pos in self.stage],
            "hot_pixels": [[int(y), int(x), float(v)] for y, x, v in zip(*self.hot_pixels())],
        }
        write_text_atomic(folder / "truth.json", json.dumps(truth, indent=1))
        flats = np.stack([np.stack([self.flatfield(ch, z) for z in range(1, spec.z_planes + 1)])
                          for ch in range(1, spec.channels + 1)])
        darks = np.stack([np.stack([self.darkfield(ch, z) for z in range(1, spec.z_planes + 1)])
                          for ch in range(1, spec.channels + 1)])
        write_tiff(folder / "flatfield.tif", flats, photometric="minisblack")
        write_tiff(folder / "darkfield.tif", darks, photometric="minisblack")


def _hat_integral(x: np.ndarray) -> np.ndarray:
    """Integral from -inf to x of the unit triangle max(0, 1 - |t|)."""
    x = np.clip(x, -1.0, 1.0)
    return np.where(x < 0, 0.5 * (x + 1) ** 2, 1 - 0.5 * (1 - x) ** 2)


def image_sheet(sharp: np.ndarray, depth: np.ndarray, fine_psf: np.ndarray, n_planes: int,
                thickness: float = 0.0) -> np.ndarray:
    """Widefield z-stack (``n_planes`` x YX, float32) of the specimen ``sharp`` centred at in-focus
    depth ``depth`` per pixel (in planes, fractional), through ``fine_psf``: a ZYX PSF sampled
    ``DEPTH_LEVELS`` times finer in z than the planes.

    ``thickness`` 0: a thin sheet, split linearly between the two nearest fine levels. Otherwise a
    uniform slab ``thickness`` planes deep (the same pattern all through, total ``sharp``), spread
    over the levels it covers by the integral of that linear split. Each recorded plane sums every
    level convolved with the PSF at its defocus (borders mirrored). Splitting a sheet between the
    two nearest *recorded* planes instead would make a sheet halfway between planes two half-sheets,
    each sharp in its own plane."""
    lo = (depth - thickness / 2) * DEPTH_LEVELS
    hi = (depth + thickness / 2) * DEPTH_LEVELS
    span = thickness * DEPTH_LEVELS
    hzf, pad = fine_psf.shape[0] // 2, fine_psf.shape[1] // 2
    shape = [sp_fft.next_fast_len(n + 4 * pad, real=True) for n in sharp.shape]  # mirrored margin + convolution margin
    acc = np.zeros((n_planes, shape[0], shape[1] // 2 + 1), np.complex64)
    first, last = int(np.floor(lo.min())), int(np.ceil(hi.max()))
    for start in range(first, first + DEPTH_LEVELS):  # levels j = start (mod DEPTH_LEVELS) need only the PSF planes
        otf: dict[int, np.ndarray] = {}                # at offsets = -start: 1/DEPTH_LEVELS of them held at a time
        for j in range(start, last + 1, DEPTH_LEVELS):
            if span > 0:
                weight = (_hat_integral(hi - j) - _hat_integral(lo - j)) / span
            else:
                weight = np.maximum(0, 1 - np.abs(lo - j))
            if not weight.any():
                continue
            sheet = sp_fft.rfft2(np.pad(sharp * weight.astype(np.float32), pad, mode="reflect"), shape)
            for z in range(n_planes):
                off = z * DEPTH_LEVELS - j
                if abs(off) <= hzf:
                    if off not in otf:
                        otf[off] = sp_fft.rfft2(fine_psf[hzf + off], shape).astype(np.complex64)
                    acc[z] += sheet * otf[off]
        del otf
    fy, fx = sharp.shape
    out = np.empty((n_planes, fy, fx), np.float32)
    for z in range(n_planes):                                    # 'same' crop of the mirrored sheet's convolution
        out[z] = sp_fft.irfft2(acc[z], shape)[2 * pad:2 * pad + fy, 2 * pad:2 * pad + fx]
    return out


def load_truth(raw_dir: str | Path) -> tuple[SynthDataset, dict]:
    """Rebuild the SynthDataset of a written dataset from its truth.json."""
    truth = json.loads((Path(raw_dir) / "truth" / "truth.json").read_text())
    spec = dict(truth["spec"])
    spec["tile"] = tuple(spec["tile"])
    spec["blank_tiles"] = tuple(spec["blank_tiles"])
    spec["markers"] = tuple(spec["markers"])
    return SynthDataset(SynthSpec(**spec)), truth
