"""The deconvolve stage: Richardson-Lucy per channel (each plane with the in-focus PSF, or the stack with the whole
PSF: ``deconvolution.method``) from the optics (or measured), streamed in chunks."""

from __future__ import annotations

import logging
import json
import time

import numpy as np

from ..experiment import CycleSpec
from ..image import deconvolution, psf
from ..io.tiff import StackReader, atomic_path, ome_writer, write_text_atomic
from ..job import JobContext
from ._common import per_channel

log = logging.getLogger("plexgpu")


def optics_for(spec: CycleSpec, optics_cfg: dict, decon_cfg: dict, channel: int) -> psf.Optics:
    return psf.Optics(pixel_size_um=spec.pixel_size_um, z_step_um=spec.z_step_um, na=optics_cfg["na"],
                      immersion_index=optics_cfg["immersion_index"], sample_index=optics_cfg["sample_index"],
                      emission_nm=spec.emission(channel), model=decon_cfg["psf_model"],
                      depth_um=(spec.z_planes - 1) * spec.z_step_um / 2)


def kernel_for(spec: CycleSpec, o: psf.Optics, decon_cfg: dict, channel: int, n_planes: int):
    """The kernel RL uses for the channel: the PSF, measured (deconvolution.psf_file) on the data's grid or
    computed from the optics; with ``deconvolution.method: lateral`` only its in-focus plane (psf.in_focus).

    Why lateral is the default (bench/decon_edf.py, judged against the sharp specimen): a widefield OTF
    has a missing cone, so a 3-D RL cannot put a section's slowly varying light back at its depth in tens
    of iterations; each plane of the deconvolved stack holds a fraction of each cell's light that varies
    from cell to cell, and the EDF of it was below the plain EDF and the maximum projection. Each plane
    deconvolved with the in-focus blur only keeps its light where it is and sharpens what the EDF takes."""
    path = psf.file_for(decon_cfg, channel)
    if path:
        voxel = decon_cfg.get("psf_voxel_um")
        kernel = psf.measured(path, tuple(voxel) if voxel else None, spec.z_step_um, spec.pixel_size_um,
                              max_planes=2 * n_planes - 1)
    else:
        kernel = psf.psf(o, *psf.default_half_size(o, n_planes))
    return psf.in_focus(kernel, o) if decon_cfg["method"] == "lateral" else kernel


def deconvolve(ctx: JobContext, spec: CycleSpec, optics_cfg: dict, decon_cfg: dict, inputs, out):
    """Richardson-Lucy per channel with a PSF from the optics; float32, flux kept. ``inputs["stitched"]``
    and ``out["deconvolved"]``: one path per channel (the rule's snakemake.input / output).

    Streamed: each XY chunk is read from the stitched stack and its result written straight
    into the output file, so host memory holds one chunk's work, not the stacks."""
    stitched, deconvolved = per_channel(spec, inputs["stitched"]), per_channel(spec, out["deconvolved"])
    if decon_cfg["iterations"] == 0:        # no RL: the stitched stack is the deconvolved one, no device work
        import shutil

        for ch in spec.channels:
            with atomic_path(deconvolved[ch]) as tmp:
                shutil.copyfile(stitched[ch], tmp)
        write_text_atomic(out["flux"], json.dumps({str(ch): {"iterations": 0, "explained_ratio": 1.0, "flux_ratio": 1.0}
                                                   for ch in spec.channels}))
        log.info("deconvolution.iterations = 0: the stitched stacks are copied as they are (no Richardson-Lucy)")
        return
    record = {}
    for ch in spec.channels:
        stack = StackReader(stitched[ch], ctx.workers)   # ZYX, >= MIN_PLANES planes (checked with the raw data)
        shape = stack.shape
        o = optics_for(spec, optics_cfg, decon_cfg, ch)
        kernel = kernel_for(spec, o, decon_cfg, ch, shape[0])
        budget = deconvolution.memory_budget(ctx.xp, shape)
        chunk = deconvolution.chunk_for_budget(shape, kernel.shape, budget, decon_cfg["chunk_px"])
        halo = deconvolution.default_halo(kernel.shape)
        n_chunks = len(deconvolution.chunk_slices(shape[1], chunk, 0)) * len(deconvolution.chunk_slices(shape[2], chunk, 0))
        log.info("CH%d: %s stack in %d chunks of <= %d px (halo %d px; RL work per chunk <= %.0f MB, budget %.0f MB)",
                 ch, shape, n_chunks, chunk, halo, deconvolution.working_bytes(
                     deconvolution.piece_shape(shape, chunk, halo), kernel.shape) / 2**20, budget / 2**20)
        advance = ctx.progress(f"{spec.key} CH{ch} RL x{decon_cfg['iterations']}", n_chunks)
        t0 = time.perf_counter()
        flux: dict = {}
        with ome_writer(deconvolved[ch], shape, np.float32, "ZYX", spec.pixel_size_um, spec.z_step_um,
                        [spec.marker(ch)], workers=ctx.workers) as result:
            deconvolution.deconvolve(stack, kernel, decon_cfg["iterations"], chunk, xp=ctx.xp, workers=ctx.workers,
                                     progress=lambda d, t: advance(), out=result, flux=flux)
        record[str(ch)] = {"iterations": decon_cfg["iterations"], "flux_ratio": flux["out"] / max(flux["in"], 1e-12),
                           "explained_ratio": flux["explained"] / max(flux["in"], 1e-12)}
        log.info("CH%d: the result blurred again holds %.4f of the recorded light (RL's fit)", ch,
                 record[str(ch)]["explained_ratio"])
        log.info("CH%d: %s RL, PSF %s (%s), %d iterations in %.1f s, flux ratio %.4f", ch, decon_cfg["method"],
                 kernel.shape, psf.file_for(decon_cfg, ch) or f"{o.model}, {o.emission_nm:.0f} nm", decon_cfg["iterations"],
                 time.perf_counter() - t0, flux["out"] / max(flux["in"], 1e-12))
    write_text_atomic(out["flux"], json.dumps(record, indent=1))
