# Per cycle: stitch -> deconvolve -> edf. Outputs are the stage registry's (paths.PIPELINE); each
# script hands snakemake.input/output straight to its stage function. On SLURM the three are one job
# group per cycle (CYCLE_GROUP): one allocation, one GPU, the stages one after another on it, no queue
# wait and no second start-up between them; each stage still writes its own outputs and log, so a
# scancel mid-deconvolve reruns deconvolve and edf only. Run locally, Snakemake ignores groups.


rule stitch:
    input:
        raw=raw_folder,
        dark=dark_frame,
    output:
        **stage_outputs("stitch"),
    log:
        f"{R}/{paths.log_file('stitch', '{cycle}')}",
    group:
        CYCLE_GROUP
    conda:
        "../envs/plexgpu.yaml"
    threads: res("stitch", "cpus_per_task")
    resources:
        **rule_resources("stitch"),
    params:
        spec=lambda wc: SPECS[wc.cycle],
        basic=config["basic"],
        stitch=config["stitch"],
        device=DEVICE,
        accounting=ACCOUNTING,
    script:
        "../scripts/stitch.py"


rule deconvolve:
    input:
        stitched=stage_output("stitch", "stitched"),
        psf=psf_files,
    output:
        **stage_outputs("deconvolve"),
    log:
        f"{R}/{paths.log_file('deconvolve', '{cycle}')}",
    group:
        CYCLE_GROUP
    conda:
        "../envs/plexgpu.yaml"
    threads: res("deconvolve", "cpus_per_task")
    resources:
        **rule_resources("deconvolve"),
    params:
        spec=lambda wc: SPECS[wc.cycle],
        optics=config["optics"],
        deconvolution=config["deconvolution"],
        device=DEVICE,
        accounting=ACCOUNTING,
    script:
        "../scripts/deconvolve.py"


rule edf:
    input:
        stitched=stage_output("stitch", "stitched"),
        deconvolved=stage_output("deconvolve", "deconvolved"),
        planes=stage_output("stitch", "planes"),
    output:
        **stage_outputs("edf"),
    log:
        f"{R}/{paths.log_file('edf', '{cycle}')}",
    group:
        CYCLE_GROUP
    conda:
        "../envs/plexgpu.yaml"
    threads: res("edf", "cpus_per_task")
    resources:
        **rule_resources("edf"),
    params:
        spec=lambda wc: SPECS[wc.cycle],
        edf=config["edf"],
        device=DEVICE,
        accounting=ACCOUNTING,
    script:
        "../scripts/edf.py"
