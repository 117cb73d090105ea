"""The edf stage: extended depth of field of the stitched and of the deconvolved stacks, per channel."""

from __future__ import annotations

import logging

import numpy as np

from .. import xp as xpmod
from ..experiment import CycleSpec
from ..image import edf
from ..io.tiff import StackReader, write_plane
from ..job import JobContext
from ..planes import PlanesRecord
from ._common import per_channel

log = logging.getLogger("plexgpu")


def extended_depth(ctx: JobContext, spec: CycleSpec, edf_cfg: dict, inputs, out):
    """EDF per channel of the stitched stack (``inputs["stitched"]`` -> ``out["edf"]``, for
    quantification, with its focus map ``out["focus"]``) and of the deconvolved stack
    (``inputs["deconvolved"]`` -> ``out["edf_deconvolved"]``); each one path per channel, the rule's
    snakemake.input / output; ``inputs["planes"]``: the stitch stage's planes.json. The quality
    gate judges what the camera recorded in each tile of each plane, and a faulty tile is left out
    of its plane where it lies in the mosaic only.

    Two images because one cannot be both (bench/decon_edf.py): Richardson-Lucy stopped after tens
    of iterations sharpens but leaves each cell's integrated intensity uneven, while the EDF of the
    stitched stack keeps it; the first is for quantification, the second for display and segmentation."""
    record = PlanesRecord.read(inputs["planes"])
    stacks = {"quantification": (per_channel(spec, inputs["stitched"]), per_channel(spec, out["edf"])),
              "deconvolved": (per_channel(spec, inputs["deconvolved"]), per_channel(spec, out["edf_deconvolved"]))}
    focus_out = per_channel(spec, out["focus"])
    for ch in spec.channels:
        stats = record.tile_stats(ch)
        kept, bad = edf.quality_gate(stats, label=f"{spec.key} CH{ch}: ")
        for z, faults in enumerate(bad):
            for t, why in faults.items():
                log.warning("CH%d Z%03d: tile %d left out of the EDF where it lies: %s", ch, z + 1, t + 1, why)
        for i, (kind, (sources, targets)) in enumerate(stacks.items()):
            stack = StackReader(sources[ch], ctx.workers)    # read plane by plane, never whole
            res = edf.extended_depth_of_field(stack, edf_cfg["radius"], edf_cfg["sigma"], kept, xp=ctx.xp,
                                              invalid=_fault_masks(bad, record.footprints, stack.shape[1:]))
            write_plane(targets[ch], xpmod.to_host(res.image), spec.marker(ch), spec.pixel_size_um,
                        workers=ctx.workers)
            if i == 0:
                write_plane(focus_out[ch], xpmod.to_host(res.focus_index), "focus index", spec.pixel_size_um,
                            workers=ctx.workers)
            del res
            log.info("CH%d: EDF (%s) from %d of %d planes", ch, kind, len(kept), stack.shape[0])


def _fault_masks(bad: list[dict], footprints: list, shape):
    """invalid(z) for the EDF: the mosaic footprints of plane z's faulty tiles (None: none)."""
    def invalid(z):
        if not bad[z]:
            return None
        mask = np.zeros(shape, bool)
        for t in bad[z]:
            y, x, h, w = footprints[t]
            mask[y:y + h, x:x + w] = True
        return mask
    return invalid
