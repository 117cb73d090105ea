"""Snakemake wrapper of rule registration: read snakemake.*, call the library."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "workflow"))  # noqa: F821 (the library)

from plexgpu import stages
from plexgpu.experiment import CycleSpec
from plexgpu.job import job_context

sm = snakemake  # noqa: F821 (provided by Snakemake)
specs = [CycleSpec.from_dict(d) for d in sm.params.specs]
with job_context("registration", sm.log[0], sm.resources, sm.params.device, sm.params.accounting) as ctx:
    stages.register(ctx, specs, sm.params.registration, sm.input, sm.output, sm.params.shared_camera)
