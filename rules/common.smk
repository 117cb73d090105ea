# Config validation (the one schema), raw discovery (once per Snakefile parse: the coordinator
# and each SLURM job), path helpers and input functions shared by all rules.

import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))  # the library, installed or not

from snakemake.exceptions import WorkflowError

from plexgpu.cluster.assignment import (
    AssignmentError,
    build_cycle_assignment,
    check_known_accounts,
    registration_slot,
)
from plexgpu import paths, qc_state
from plexgpu.config import ConfigError, validate_config
from plexgpu.experiment import cycle_spec
from plexgpu.manifest import resolve_run, write_manifest
from plexgpu.image.basic import DarkfieldSetting
from plexgpu.io.raw import RawDataError
from plexgpu.cluster.locks import DataSetBusy, claim_data_set, keep_other_runs_locks, release_data_set
from plexgpu.cluster.slurm import CYCLE_GROUP, user_accounts
from snakemake_scheduler_plugin_gpu_only import slot_token

if not config:
    raise WorkflowError(
        "plexgpu: no config given; run e.g. `snakemake registration --configfile config/config.yaml`"
    )
try:
    validate_config(config)  # snakemake.utils.validate against config/schema/config.schema.yaml
    # the raw data and gpu_slots: auto (sacctmgr) resolved by the coordinator; a SLURM job's parse
    # reads them from the run manifest the coordinator wrote at the start (onstart, Snakefile)
    EXPERIMENT, RUN_KEY = resolve_run(config, coordinator=workflow.is_main_process)
except (ConfigError, RawDataError) as exc:
    raise WorkflowError(f"plexgpu: {exc}")

R = str(EXPERIMENT.results_dir)
CYCLES = EXPERIMENT.cycle_keys
CHANNELS = EXPERIMENT.channels
CYCLE_SPECS = {s.key: s for s in (cycle_spec(EXPERIMENT, c) for c in EXPERIMENT.cycles)}
SPECS = {key: spec.as_dict() for key, spec in CYCLE_SPECS.items()}  # JSON-able, passed to jobs
DEVICE = config["compute"]["device"]

# GPU-only scheduling: with accounts configured, every GPU-stage job asks SLURM
# for exactly one GPU on its assigned account and partition. Without accounts (a workstation)
# no SLURM resources are set. compute.device only chooses the array backend.
ACCOUNTS = config["accounts"]
try:
    ASSIGNMENT = build_cycle_assignment(CYCLES, ACCOUNTS) if ACCOUNTS else {}
    REGISTRATION_SLOT = registration_slot(ACCOUNTS) if ACCOUNTS else None
    if ACCOUNTS and workflow.is_main_process:  # the coordinator asks SLURM once; jobs do not
        check_known_accounts(ACCOUNTS, user_accounts())
except AssignmentError as exc:
    raise WorkflowError(f"plexgpu: {exc}")


wildcard_constraints:
    cycle=r"cyc\d{3}",


def raw_folder(wildcards):
    """The cycle's raw folder, one input instead of every tile (5,000 paths per job log for a real
    cycle): the tiles were proven complete when the config was read (resolve_experiment), raw data
    are never modified, and a tile added or removed changes the folder's mtime, so a rerun follows."""
    return CYCLE_SPECS[wildcards.cycle].folder


def dark_frame(wildcards):
    """The dark frame TIFF of basic.darkfield, where the user gave one (a rerun follows it)."""
    frame = DarkfieldSetting.from_config(config["basic"]["darkfield"]).frame
    return [frame] if frame else []


def psf_files(wildcards):
    """The measured PSF files of deconvolution.psf_file (a rerun follows them)."""
    files = config["deconvolution"]["psf_file"]
    return sorted(set(files.values())) if isinstance(files, dict) else [files] if files else []


def res(rule_name, key):
    """A rule's resource from config key resources.<rule>.<key> (defaults in the schema)."""
    return config["resources"][rule_name][key]


def stage_outputs(name):
    """A stage's named outputs from the registry (paths.PIPELINE): a rule declares them with
    ``output: **stage_outputs(name)``; a per-cycle stage keeps {cycle} as its wildcard."""
    return paths.outputs(name, R, CHANNELS, cycles=CYCLES)


def stage_output(name, output):
    """One named output of a stage, as its rule declares it (an input of a later rule)."""
    return stage_outputs(name)[output]


def listed(paths_):
    """A named output's paths as a list (one path, or a list per channel or cycle)."""
    return [paths_] if isinstance(paths_, str) else paths_


def over_cycles(name, output):
    """One output of a per-cycle stage for every cycle (a per-channel one cycle-major and channel-minor):
    what a stage over all cycles reads (expand() over a list would go channel-major)."""
    return [f for c in CYCLES for f in listed(paths.outputs(name, R, CHANNELS, c)[output])]


def flat(outputs):
    """Every path of a stage's named outputs, in order."""
    return [f for v in outputs.values() for f in listed(v)]


def stage_folders(*stages):
    """The folders a stage writes its files in: what a QC rule takes as input (QC reads what exists;
    rules/qc.smk says why)."""
    return sorted({str(Path(p).parent) for s in stages for p in flat(stage_outputs(s))})


def stage_files_of(stage):
    """A stage's named outputs for the job's cycle, as the QC function reads them (a params function)."""
    return lambda wildcards: paths.outputs(stage, R, CHANNELS, getattr(wildcards, "cycle", ""), CYCLES)


FINAL_OUTPUTS = flat(stage_outputs(paths.PIPELINE[-1].name))  # the last stage's files: target `all`
QC_INDEX = f"{R}/{paths.QC_INDEX}"
ACCOUNTING = f"{R}/{paths.ACCOUNTING}"  # one record per GPU job, written by the job itself


def qc_inputs(wildcards):
    """The QC metrics of every (stage, cycle) whose stage is done, and the job records (their folder:
    a failure recorded changes the page)."""
    out = {
        s.name: [
            f"{R}/qc/{s.name}/{c}.json" for c in CYCLES if qc_state.qc_ready(R, s.name, c, CHANNELS, CYCLES)
        ]
        for s in paths.PIPELINE
        if s.per_cycle
    }
    out["registration"] = (
        [f"{R}/qc/registration.json"] if qc_state.qc_ready(R, "registration", "", CHANNELS, CYCLES) else []
    )
    out["records"] = [ACCOUNTING] if Path(ACCOUNTING).is_dir() else []
    return out


# Each account's GPU slots are a global resource `gpu_<account>` = its gpu_slots (unless the user
# gave one with --resources): Snakemake's own scheduler loop counts them, frees them when a job ends
# or fails, and counts a cycle's group job once, for the gpu-only scheduler and the built-in ones.
def claim_data_set_or_stop(results_dir):
    """This run is the one coordinator of its data set's GPU jobs, or it stops in one line (onstart)."""
    try:
        claim_data_set(results_dir)
    except DataSetBusy as exc:
        raise WorkflowError(f"plexgpu: {exc}")


# a run that ends deletes its own Snakemake locks only, not another data set's (plexgpu.cluster.locks)
if workflow.is_main_process:
    keep_other_runs_locks()

for _a in ACCOUNTS:
    if slot_token(_a["name"]) not in workflow.global_resources:
        workflow.register_resource(slot_token(_a["name"]), int(_a["gpu_slots"]))


def rule_resources(rule_name):
    """Every rule's resources, from one place: cpus_per_task, mem_mb and runtime from config key
    resources.<rule_name> ("qc" for the QC rules); for a GPU stage of the registry (paths.PIPELINE) its
    ``gpu_stage`` rank (how the gpu-only scheduler knows GPU work and its order) and, with accounts
    configured, one GPU (`gpu=1`), the assigned account and partition and per-account slot tokens
    `gpu_<account>` (1 for its account, 0 for the others; the account's gpu_slots are the global
    resource of that name). Independent of the attempt."""
    out = {k: res(rule_name, k) for k in ("cpus_per_task", "mem_mb", "runtime")}
    rank = paths.gpu_stage_rank(rule_name)
    if not rank:
        return out
    out["gpu_stage"] = rank
    if not ACCOUNTS:
        return out
    per_cycle = paths.stage(rule_name).per_cycle
    slot = (lambda wc: ASSIGNMENT[wc.cycle]) if per_cycle else (lambda wc: REGISTRATION_SLOT)
    out.update(
        gpu=1,
        slurm_account=lambda wc: slot(wc).account,
        slurm_partition=lambda wc: slot(wc).partition or "",
    )
    for a in ACCOUNTS:
        out[slot_token(a["name"])] = lambda wc, name=a["name"]: int(slot(wc).account == name)
    return out
