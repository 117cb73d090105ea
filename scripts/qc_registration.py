"""Snakemake wrapper of rule qc_registration (CPU): read snakemake.*, call the library."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "workflow"))  # noqa: F821 (the library)

from plexgpu import qc
from plexgpu.job import job_context

sm = snakemake  # noqa: F821
with job_context("qc_registration", sm.log[0], sm.resources, "cpu"):
    qc.qc_registration(sm.input.shifts, sm.input.transforms, list(sm.input.reference), sm.params.cycles,
                       list(sm.output.overlays), sm.output.metrics)
