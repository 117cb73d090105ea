"""How much device memory each GPU stage of a cycle needs, known before a GPU is asked for, and how
much the partition's GPU has.

The peaks (bench/gpu_budget.py measures them on the CuPy path under the strict stand-in at five
sizes and prints measured / predicted for each; within 15 % there):

- stitch: the BaSiC fit holds every plane of the cycle at working size (``basic.working_size``)
  with its iterates, STITCH_BUFFERS float32 copies of (planes x tiles x working_size^2); blending
  one plane at a time holds far less at any real size.
- deconvolve: its own chunk planner (``image.deconvolution``): the largest XY piece whose RL work
  fits half the free device memory, at most ``deconvolution.chunk_px``; its peak is that piece's
  ``working_bytes``. It adapts to the device, so it fits unless even the smallest chunk does not.
- edf: one plane of the mosaic at a time, EDF_BUFFERS float32 mosaic-sized arrays.
- registration (one job for all cycles): REGISTRATION_PLANES float32 mosaic planes (the reference, the
  moving cycle, a channel, its spline coefficients, the registered plane), and on top, whichever is
  larger: the coordinates of one interpolation strip of ``registration.STRIP_ROWS`` rows
  (REGISTRATION_STRIP_BUFFERS float32 arrays of it) or the block batch being measured
  (REGISTRATION_BATCH_BUFFERS x its float32 blocks, at most ``registration.BLOCK_BATCH_BYTES``).
  Measured under the stand-in at 1536 and 4096 px, strips and batch each made negligible in turn.
"""

from __future__ import annotations

import re

STITCH_BUFFERS = 7.8     # measured: the BaSiC fit's peak over one float32 copy of its working stacks
EDF_BUFFERS = 10.6       # measured: the EDF stage's peak over one float32 mosaic plane
REGISTRATION_PLANES = 5.2          # measured: registration's peak over one float32 mosaic plane ...
REGISTRATION_STRIP_BUFFERS = 12.2  # ... plus this many float32 arrays of one interpolation strip,
REGISTRATION_BATCH_BUFFERS = 4.0   # ... or this many copies of the block batch, whichever is larger

#: memory of whole GPUs by the model names SLURM's GRES types use (lower case), bytes
GPU_MODELS = {"h200": 141e9, "h100": 80e9, "h100_nvl": 94e9, "gh200": 96e9, "b200": 180e9, "b100": 180e9,
              "a100": 40e9, "a100_80gb": 80e9, "a100-80gb": 80e9, "a100_40gb": 40e9, "a40": 48e9, "l40s": 48e9,
              "l40": 48e9, "a6000": 48e9, "rtx6000": 48e9, "l4": 24e9, "a10": 24e9, "a30": 24e9, "t4": 16e9,
              "v100": 16e9, "v100_32gb": 32e9, "p100": 16e9}
MIG = re.compile(r"(\d+)g\.(\d+)gb")        # a MIG profile names its memory: 3g.40gb, 1g.10gb, 7g.141gb


def device_bytes(gres_type: str) -> float | None:
    """The memory of a GRES type (a model or a MIG profile), None where it is not known."""
    t = gres_type.lower()
    m = MIG.search(t)
    if m:
        return float(m.group(2)) * 1e9
    if t in GPU_MODELS:
        return GPU_MODELS[t]
    base = re.sub(r"[-_]?(pcie|sxm\d?|nvl)$", "", t)
    return GPU_MODELS.get(base)


def mosaic_shape(rows: int, cols: int, tile: tuple[int, int], overlap: float) -> tuple[int, int]:
    from .image.stitching import nominal_step

    sy, sx = nominal_step(tile, overlap)
    return (rows - 1) * sy + tile[0], (cols - 1) * sx + tile[1]


def stitch_peak(tiles: int, planes: int, working_size: int) -> float:
    return STITCH_BUFFERS * 4.0 * planes * tiles * working_size ** 2


def edf_peak(mosaic: tuple[int, int]) -> float:
    return EDF_BUFFERS * 4.0 * mosaic[0] * mosaic[1]


def registration_peak(mosaic: tuple[int, int], block_px: int) -> float:
    from .image.registration import BLOCK_BATCH_BYTES, STRIP_ROWS

    blocks = min((mosaic[0] // block_px) * (mosaic[1] // block_px) * 4.0 * block_px ** 2, BLOCK_BATCH_BYTES)
    strip = 4.0 * min(STRIP_ROWS, mosaic[0]) * mosaic[1]
    return (REGISTRATION_PLANES * 4.0 * mosaic[0] * mosaic[1]
            + max(REGISTRATION_STRIP_BUFFERS * strip, REGISTRATION_BATCH_BUFFERS * blocks))


def cycle_peaks(spec, config: dict, tile: tuple[int, int], devices: dict | None = None) -> dict:
    """Every GPU stage's predicted peak for one cycle of ``spec`` with tiles of ``tile`` px: {"mosaic",
    "stitch", "edf", "registration" (bytes; registration is one job for all cycles, on mosaics of this
    size), "deconvolve": {device: ``deconvolve_plan`` of its largest channel} for each of ``devices``
    ({name: free bytes})}. What plan prints and the benches check."""
    from .stages._deconvolve import kernel_for, optics_for

    mosaic = mosaic_shape(spec.rows, spec.cols, tile, spec.overlap)
    psfs = [kernel_for(spec, optics_for(spec, config["optics"], config["deconvolution"], ch),
                       config["deconvolution"], ch, spec.z_planes).shape for ch in spec.channels] if devices else []
    decon = {}
    for name, free in (devices or {}).items():
        plans = [dict(deconvolve_plan((spec.z_planes, *mosaic), p, free, config["deconvolution"]["chunk_px"]), psf=p)
                 for p in psfs]
        decon[name] = max(plans, key=lambda pl: pl["peak_bytes"])
    return {"mosaic": mosaic, "stitch": stitch_peak(spec.rows * spec.cols, len(spec.channels) * spec.z_planes,
                                                     config["basic"]["working_size"]),
            "edf": edf_peak(mosaic), "registration": registration_peak(mosaic, config["registration"]["block_px"]),
            "deconvolve": decon}


def deconvolve_plan(stack: tuple[int, int, int], psf_shape: tuple[int, ...], free_bytes: float,
                    chunk_px: int) -> dict:
    """What the deconvolve stage will do on a device with ``free_bytes`` free: its chunk, halo and
    peak (the largest piece's RL working bytes)."""
    from .image import deconvolution as dc

    chunk = dc.chunk_for_budget(stack, psf_shape, 0.5 * free_bytes, chunk_px)
    halo = dc.default_halo(psf_shape)
    return {"chunk": chunk, "halo": halo, "peak_bytes": dc.working_bytes(dc.piece_shape(stack, chunk, halo), psf_shape),
            "smallest": chunk <= dc.MIN_CHUNK_PX}
