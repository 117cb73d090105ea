"""Snakemake wrapper of rule qc_registration (CPU): read snakemake.*, call the library."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "workflow"))  # noqa: F821 (the library)

from plexgpu import qc
from plexgpu.job import job_context

sm = snakemake  # noqa: F821
with job_context("qc_registration", sm.log[0], sm.resources, "cpu"):
    reg = sm.params.registration
    per_cycle = len(reg["registered"]) // len(sm.params.cycles)          # cycle-major, channel-minor
    reference = reg["registered"][sm.params.channels.index(sm.params.reference_channel)::per_cycle]
    qc.qc_registration(reg["shifts"], reg["transforms"], reference, sm.params.cycles, list(sm.output.overlays),
                       sm.output.metrics)
