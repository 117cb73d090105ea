"""Snakemake wrapper of rule qc: collect the stage QC into qc/index.html and qc/metrics.json."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "workflow"))  # noqa: F821 (the library)

from plexgpu import qc_page
from plexgpu.job import job_context

sm = snakemake  # noqa: F821
with job_context("qc", sm.log[0], {"cpus_per_task": 1}, "cpu"):  # a local rule: one process, its log
    qc_page.write_index(sm.output.html, sm.output.metrics, sm.input, sm.params.cycles, sm.params.channels)
