"""Snakemake wrapper of rule qc_edf (CPU): read snakemake.*, call the library."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "workflow"))  # noqa: F821 (the library)

from plexgpu import qc
from plexgpu.job import job_context

sm = snakemake  # noqa: F821
with job_context("qc_edf", sm.log[0], sm.resources, "cpu"):
    qc.qc_edf(sm.wildcards.cycle, sm.params.edf["edf"], sm.params.edf["focus"], sm.params.stitch["planes"],
              sm.output.png, sm.output.metrics)
