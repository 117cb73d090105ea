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
    # once per run, not on a dry run: what the coordinator resolved, for every job's parse to read
    if workflow.is_main_process:
        write_manifest(config, RUN_KEY, EXPERIMENT)


onerror:
    # one summary of what is not done and the next step, instead of "look above for error messages"
    from plexgpu.cluster.rerun import next_steps

    print(next_steps(R, CYCLES, CHANNELS, workflow.configfiles), file=sys.stderr)
