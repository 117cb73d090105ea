# Per cycle, one GPU job each: stitch -> deconvolve -> edf.


rule stitch:
    input:
        raw=raw_folder,
        dark=dark_frame,
    output:
        stitched=per_channel(STITCHED),
        profiles=per_channel(PROFILES),
        positions=f"{R}/{paths.POSITIONS}",
        pairs=f"{R}/{paths.PAIRS}",
        planes=f"{R}/{paths.PLANES}",
    log:
        f"{R}/logs/stitch/{{cycle}}.log",
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
        stitched=per_channel(STITCHED),
        psf=psf_files,
    output:
        deconvolved=per_channel(DECONVOLVED),
    log:
        f"{R}/logs/deconvolve/{{cycle}}.log",
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
        stitched=per_channel(STITCHED),
        deconvolved=per_channel(DECONVOLVED),
        planes=f"{R}/{paths.PLANES}",
    output:
        edf=per_channel(EDF),
        edf_deconvolved=per_channel(EDF_DECONVOLVED),
        focus=per_channel(FOCUS),
    log:
        f"{R}/logs/edf/{{cycle}}.log",
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
