# QC: metrics and pictures per stage, apart from the image pipeline. CPU only: no GPU is
# requested, and target `registration` never pulls these in.
#
# QC reads what exists and never runs a stage: its inputs are the stages' folders, which no rule
# declares as an output (so Snakemake never schedules a stage for QC, not even an outdated one),
# and whose mtime changes whenever a stage writes a file in them (every output is renamed into
# place), so QC reruns after its stage did. The page's rule asks only for the QC of stages that are
# done; a stage that failed or has not run shows as such, with its error line and log.


rule qc_stitch:
    input:
        stage_folders("stitch"),
    output:
        png=f"{R}/qc/stitch/{{cycle}}.png",
        shading=f"{R}/qc/stitch/{{cycle}}.shading.png",
        metrics=f"{R}/qc/stitch/{{cycle}}.json",
    log:
        f"{R}/{paths.log_file('qc_stitch', '{cycle}')}",
    conda:
        "../envs/plexgpu.yaml"
    threads: res("qc", "cpus_per_task")
    resources:
        **rule_resources("qc"),
    params:
        stitch=stage_files_of("stitch"),
        reference_channel=config["registration"]["reference_channel"],
        channels=CHANNELS,
    script:
        "../scripts/qc_stitch.py"


rule qc_decon:
    input:
        stage_folders("stitch", "deconvolve"),
    output:
        png=f"{R}/qc/deconvolve/{{cycle}}.png",
        metrics=f"{R}/qc/deconvolve/{{cycle}}.json",
    log:
        f"{R}/{paths.log_file('qc_decon', '{cycle}')}",
    conda:
        "../envs/plexgpu.yaml"
    threads: res("qc", "cpus_per_task")
    resources:
        **rule_resources("qc"),
    params:
        stitch=stage_files_of("stitch"),
        deconvolve=stage_files_of("deconvolve"),
    script:
        "../scripts/qc_decon.py"


rule qc_edf:
    input:
        stage_folders("stitch", "edf"),
    output:
        png=f"{R}/qc/edf/{{cycle}}.png",
        metrics=f"{R}/qc/edf/{{cycle}}.json",
    log:
        f"{R}/{paths.log_file('qc_edf', '{cycle}')}",
    conda:
        "../envs/plexgpu.yaml"
    threads: res("qc", "cpus_per_task")
    resources:
        **rule_resources("qc"),
    params:
        stitch=stage_files_of("stitch"),
        edf=stage_files_of("edf"),
    script:
        "../scripts/qc_edf.py"


rule qc_registration:
    input:
        stage_folders("registration"),
    output:
        overlays=expand(f"{R}/qc/registration/{{cycle}}.png", cycle=CYCLES),
        metrics=f"{R}/qc/registration.json",
    log:
        f"{R}/{paths.log_file('qc_registration')}",
    conda:
        "../envs/plexgpu.yaml"
    threads: res("qc", "cpus_per_task")
    resources:
        **rule_resources("qc"),
    params:
        registration=stage_files_of("registration"),
        reference_channel=config["registration"]["reference_channel"],
        cycles=CYCLES,
        channels=CHANNELS,
    script:
        "../scripts/qc_registration.py"


rule qc:
    input:
        unpack(qc_inputs),
    output:
        html=QC_INDEX,
        metrics=f"{R}/qc/metrics.json",
    log:
        f"{R}/{paths.log_file('qc')}",
    localrule: True
    conda:
        "../envs/plexgpu.yaml"
    params:
        cycles=CYCLES,
        channels=CHANNELS,
    script:
        "../scripts/qc_index.py"
