"""Snakemake wrapper of rule edf: read snakemake.*, call the library."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "workflow"))  # noqa: F821 (the library)

from plexgpu import stages
from plexgpu.experiment import CycleSpec
from plexgpu.job import job_context

sm = snakemake  # noqa: F821 (provided by Snakemake)
spec = CycleSpec.from_dict(sm.params.spec)
with job_context("edf", sm.log[0], sm.resources, sm.params.device, sm.params.accounting,
                 sm.wildcards.cycle) as ctx:
    stages.extended_depth(ctx, spec, sm.params.edf, sm.input, sm.output)
