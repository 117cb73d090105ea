"""Snakemake wrapper of rule qc_stitch (CPU): read snakemake.*, call the library."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "workflow"))  # noqa: F821 (the library)

from plexgpu import qc
from plexgpu.job import job_context

sm = snakemake  # noqa: F821
with job_context("qc_stitch", sm.log[0], sm.resources, "cpu"):
    st = sm.params.stitch
    qc.qc_stitch(sm.wildcards.cycle, st["profiles"], st["pairs"], st["planes"],
                 st["stitched"][sm.params.channels.index(sm.params.reference_channel)], sm.output.png,
                 sm.output.shading, sm.output.metrics)
