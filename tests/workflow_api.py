"""Running the plexgpu workflow through the Snakemake API from tests."""

from __future__ import annotations

from pathlib import Path

from snakemake.api import SnakemakeApi
from snakemake.settings.types import (ConfigSettings, DAGSettings, ExecutionSettings, OutputSettings, Quietness,
                                      ResourceSettings, StorageSettings)

from conftest import REPO

SNAKEFILE = REPO / "Snakefile"


def _workflow(api, workdir: Path, configfile: Path, overrides: dict | None, cores: int):
    return api.workflow(resource_settings=ResourceSettings(cores=cores),
                        config_settings=ConfigSettings(configfiles=[configfile], config=overrides or {}),
                        storage_settings=StorageSettings(), workdir=workdir, snakefile=SNAKEFILE)


def plan(workdir: Path, configfile: Path, targets=("registration",), overrides: dict | None = None,
         resources: bool = False):
    """The jobs a run would execute: sorted [(rule, cycle or '')]; with ``resources``, a dict
    {(rule, cycle): the job's resources} instead."""
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf = _workflow(api, workdir, configfile, overrides, 1)
        dag = wf.dag(dag_settings=DAGSettings(targets=set(targets)))
        dag.execute_workflow(executor="dryrun")
        # the DAG's set of jobs that need to run (no public accessor in the API)
        jobs = wf._workflow.dag._needrun
        if resources:
            return {(j.rule.name, j.wildcards.get("cycle", "")): dict(j.resources.items()) for j in jobs}
        return sorted((j.rule.name, j.wildcards.get("cycle", "")) for j in jobs)


def run(workdir: Path, configfile: Path, targets=("registration",), overrides: dict | None = None,
        cores: int = 2, keep_going: bool = False) -> None:
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf = _workflow(api, workdir, configfile, overrides, cores)
        dag = wf.dag(dag_settings=DAGSettings(targets=set(targets)))
        dag.execute_workflow(executor="local", execution_settings=ExecutionSettings(keep_going=keep_going))


def job_outputs(workdir: Path, configfile: Path, targets=("registration",)) -> dict:
    """Every job a run would execute with its named outputs: {(rule, cycle or ''): {name: [paths]}}."""
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf = _workflow(api, workdir, configfile, None, 1)
        dag = wf.dag(dag_settings=DAGSettings(targets=set(targets)))
        dag.execute_workflow(executor="dryrun")
        return {(j.rule.name, j.wildcards.get("cycle", "")):
                {name: [str(f) for f in ([files] if isinstance(files, str) else files)]
                 for name, files in j.output.items()}
                for j in wf._workflow.dag._needrun}
