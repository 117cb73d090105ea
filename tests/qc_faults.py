"""Faults a QC verdict must catch, made in raw data written by the synthetic generator: each changes
what a microscope would have recorded, never the pipeline's outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import ndimage

from plexgpu.image.synth import SynthDataset, SynthSpec
from plexgpu.io.raw import tile_filename
from plexgpu.io.tiff import read_tiff, write_tiff

OFFSET = 100.0            # the synthetic camera's offset (SynthSpec.dark_offset)


def _files(raw: Path, cycle: int, tile: int | None = None, channel: int | None = None) -> list[Path]:
    folder = next(raw.glob(f"cyc{cycle:03d}_reg*"))
    return sorted(folder.glob(f"1_{'*' if tile is None else f'{tile:05d}'}_Z*_CH{'*' if channel is None else channel}.tif"))


def _rewrite(path: Path, fn) -> None:
    a = read_tiff(path).astype(np.float32)
    write_tiff(path, np.clip(np.rint(fn(a)), 0, 65535).astype(np.uint16))


def foreign_tile(raw: Path, spec: SynthSpec, cycle: int, tile: int) -> None:
    """The tile of another specimen (another seed) recorded in its place, every plane and channel."""
    other = raw.parent / f"{raw.name}_other"
    SynthDataset(SynthSpec(**{**spec.__dict__, "seed": spec.seed + 1000, "cycles": 1,
                              "blank_tiles": ()})).write(other)
    for z in range(1, spec.z_planes + 1):
        for ch in range(1, spec.channels + 1):
            name = tile_filename(1, tile, z, ch)
            write_tiff(next(raw.glob(f"cyc{cycle:03d}_reg*")) / name, read_tiff(next(other.glob("cyc001_reg*")) / name))


def blank_tile(raw: Path, cycle: int, tile: int, read_noise: float = 3.0) -> None:
    """No light reached the camera (lamp or shutter): its offset and read noise only."""
    rng = np.random.default_rng(tile)
    for p in _files(raw, cycle, tile):
        _rewrite(p, lambda a: OFFSET + rng.normal(0, read_noise, a.shape))


def shifted_tile(raw: Path, cycle: int, tile: int, dx: int = 25) -> None:
    """The stage stopped ``dx`` px off for this tile (content moved sideways, the edge filled from
    the far side: what a stage error does to the overlaps)."""
    for p in _files(raw, cycle, tile):
        _rewrite(p, lambda a: np.roll(a, dx, axis=1))


def defocused_cycle(raw: Path, cycle: int, sigma_px: float = 3.0, read_noise: float = 3.0) -> None:
    """Every plane of the cycle blurred as far from focus (the autofocus missed the section): the light
    blurred, then the camera's noise drawn again (blurring the recorded frame would smooth its noise
    too, which no defocus does)."""
    rng = np.random.default_rng(cycle)

    def defocus(a):
        light = np.clip(ndimage.gaussian_filter(a - OFFSET, sigma_px), 0, None)
        return rng.poisson(light) + OFFSET + rng.normal(0, read_noise, a.shape)
    for p in _files(raw, cycle):
        _rewrite(p, defocus)


def bleached_marker(raw: Path, cycle: int, channel: int, left: float = 0.01) -> None:
    """The marker of ``channel`` bleached to ``left`` of its signal: the light above the offset scaled,
    the camera's read noise kept (the shot noise of the scaled light is smaller still)."""
    rng = np.random.default_rng(channel)
    for p in _files(raw, cycle, channel=channel):
        _rewrite(p, lambda a: (a - OFFSET) * left + OFFSET + rng.normal(0, 3.0, a.shape))


#: one data set with a fault per cycle (cycle 1 the clean reference), 4 x 4 tiles, tile 16 bare slide in
#: every cycle; a stage that repeats to 0.5 px (a stage error of 15 px at one tile is then beyond its window)
SPEC = SynthSpec(cycles=4, rows=4, cols=4, tile=(128, 128), z_planes=5, channels=2, seed=11, blank_tiles=(16,),
                 jitter_px=0.5)
CASES = {  # cycle: (fault, the stage whose verdict must turn, its level, words its reason must hold)
    "bare slide (tile 16, every cycle)": ("cyc001", "stitch", "warn", "tile 16: no texture in any overlap"),
    "foreign tile (cyc002 tile 6)": ("cyc002", "stitch", "fail", "tile 6: tissue that matches none"),
    "blank tile (cyc002 tile 11)": ("cyc002", "stitch", "fail", "tile 11: no texture where a neighbour shows"),
    "stage error of 15 px (cyc003 tile 7)": ("cyc003", "stitch", "warn",
                                             "tile 7: its neighbours match it 15 px from where the stage put it"),
    "bleached marker (cyc003 CH2 at 0.3 %)": ("cyc003", "edf", "warn", "CH2: no structure above the noise"),
    "defocused cycle (cyc004, 3 px blur)": ("cyc004", "registration", "warn", "of the reference cycle's detail"),
}


def write_fault_dataset(raw: Path) -> SynthSpec:
    SynthDataset(SPEC).write(raw)
    foreign_tile(raw, SPEC, 2, 6)
    blank_tile(raw, 2, 11)
    shifted_tile(raw, 3, 7, dx=15)
    bleached_marker(raw, 3, 2, left=0.003)
    defocused_cycle(raw, 4, 3.0)
    return SPEC
