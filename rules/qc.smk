# QC: metrics and pictures per stage, apart from the image pipeline. CPU only: no GPU is
# requested, and target `registration` never pulls these in.


rule qc_stitch:
    input:
        profiles=stage_output("stitch", "profiles"),
        pairs=stage_output("stitch", "pairs"),
        planes=stage_output("stitch", "planes"),
        reference=expand(
            f"{R}/{paths.output_pattern('stitch', 'stitched')}",
            ch=config["registration"]["reference_channel"],
            allow_missing=True,
        ),
    output:
        png=f"{R}/qc/stitch/{{cycle}}.png",
        shading=f"{R}/qc/stitch/{{cycle}}.shading.png",
        metrics=f"{R}/qc/stitch/{{cycle}}.json",
    log:
        f"{R}/logs/qc_stitch/{{cycle}}.log",
    conda:
        "../envs/plexgpu.yaml"
    threads: res("qc", "cpus_per_task")
    resources:
        **rule_resources("qc"),
    script:
        "../scripts/qc_stitch.py"


rule qc_decon:
    input:
        stitched=stage_output("stitch", "stitched"),
        deconvolved=stage_output("deconvolve", "deconvolved"),
        flux=stage_output("deconvolve", "flux"),
    output:
        png=f"{R}/qc/deconvolve/{{cycle}}.png",
        metrics=f"{R}/qc/deconvolve/{{cycle}}.json",
    log:
        f"{R}/logs/qc_decon/{{cycle}}.log",
    conda:
        "../envs/plexgpu.yaml"
    threads: res("qc", "cpus_per_task")
    resources:
        **rule_resources("qc"),
    script:
        "../scripts/qc_decon.py"


rule qc_edf:
    input:
        edf=stage_output("edf", "edf"),
        focus=stage_output("edf", "focus"),
        planes=stage_output("stitch", "planes"),
    output:
        png=f"{R}/qc/edf/{{cycle}}.png",
        metrics=f"{R}/qc/edf/{{cycle}}.json",
    log:
        f"{R}/logs/qc_edf/{{cycle}}.log",
    conda:
        "../envs/plexgpu.yaml"
    threads: res("qc", "cpus_per_task")
    resources:
        **rule_resources("qc"),
    script:
        "../scripts/qc_edf.py"


rule qc_registration:
    input:
        shifts=stage_output("registration", "shifts"),
        transforms=stage_output("registration", "transforms"),
        reference=expand(
            f"{R}/{paths.output_pattern('registration', 'registered')}",
            cycle=CYCLES,
            ch=config["registration"]["reference_channel"],
        ),
    output:
        overlays=expand(f"{R}/qc/registration/{{cycle}}.png", cycle=CYCLES),
        metrics=f"{R}/qc/registration.json",
    log:
        f"{R}/logs/qc_registration/qc_registration.log",
    conda:
        "../envs/plexgpu.yaml"
    threads: res("qc", "cpus_per_task")
    resources:
        **rule_resources("qc"),
    params:
        cycles=CYCLES,
    script:
        "../scripts/qc_registration.py"


rule qc:
    input:
        stitch=expand(f"{R}/qc/stitch/{{cycle}}.json", cycle=CYCLES),
        deconvolve=expand(f"{R}/qc/deconvolve/{{cycle}}.json", cycle=CYCLES),
        edf=expand(f"{R}/qc/edf/{{cycle}}.json", cycle=CYCLES),
        registration=f"{R}/qc/registration.json",
    output:
        html=QC_INDEX,
        metrics=f"{R}/qc/metrics.json",
    log:
        f"{R}/logs/qc/qc.log",
    localrule: True
    conda:
        "../envs/plexgpu.yaml"
    script:
        "../scripts/qc_index.py"
