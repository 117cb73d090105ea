"""Snakemake wrapper of rule qc_decon (CPU): read snakemake.*, call the library."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "workflow"))  # noqa: F821 (the library)

from plexgpu import qc
from plexgpu.job import job_context

sm = snakemake  # noqa: F821
with job_context("qc_decon", sm.log[0], sm.resources, "cpu"):
    qc.qc_decon(sm.wildcards.cycle, sm.params.stitch["stitched"], sm.params.deconvolve["deconvolved"],
                sm.params.deconvolve["flux"], sm.output.png, sm.output.metrics)
