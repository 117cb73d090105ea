# plexgpu: raw CODEX cycles -> stitched, deconvolved, EDF, registered images, on GPUs.
#
#   plexgpu plan --configfile config/config.yaml     (prints the exact command for SLURM)
#   snakemake registration --configfile config/config.yaml --profile profiles/slurm --slurm-jobname-prefix ...
#   snakemake qc --configfile config/config.yaml          (CPU only, never holds a GPU; after the run:
#                                                          it reads what exists, failed stages included)
#
# Targets go BEFORE --configfile: --configfile takes several values.

from snakemake.utils import min_version

min_version("9.0")


include: "rules/common.smk"


rule all:
    default_target: True
    input:
        FINAL_OUTPUTS,


include: "rules/cycle.smk"
include: "rules/registration.smk"
include: "rules/qc.smk"


onstart:
    # once per run, not on a dry run: what the coordinator resolved, for every job's parse to read;
    # a run with GPU jobs claims its data set (the same data set from another folder is refused)
    if workflow.is_main_process:
        if any(paths.gpu_stage_rank(j.rule.name) for j in workflow.dag.needrun_jobs()):
            claim_data_set_or_stop(R)
        write_manifest(config, RUN_KEY, EXPERIMENT)


onsuccess:
    release_data_set(R)


onerror:
    # one summary of what is not done and the next step, instead of "look above for error messages"
    from plexgpu.cluster.rerun import next_steps

    release_data_set(R)
    print(next_steps(R, CYCLES, CHANNELS, workflow.configfiles), file=sys.stderr)
