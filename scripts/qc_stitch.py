"""Snakemake wrapper of rule qc_stitch (CPU): read snakemake.*, call the library."""

from plexgpu import qc
from plexgpu.job import job_context

sm = snakemake  # noqa: F821
with job_context("qc_stitch", sm.log[0], sm.resources, "cpu"):
    qc.qc_stitch(sm.wildcards.cycle, list(sm.input.profiles), sm.input.pairs, sm.output.png, sm.output.metrics)
