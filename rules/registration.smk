# Registration: one GPU job aligning every cycle's EDFs to the reference cycle (shifts measured on the
# quantification EDF, applied to both).


rule registration:
    input:
        edf=over_cycles("edf", "edf"),
        edf_deconvolved=over_cycles("edf", "edf_deconvolved"),
        planes=over_cycles("stitch", "planes"),  # each cycle's camera offsets ...
        profiles=over_cycles("stitch", "profiles"),  # ... its flatfields ...
        positions=over_cycles("stitch", "positions"),  # ... and where its tiles lie (basic.shared_camera)
    output:
        **stage_outputs("registration"),
    log:
        f"{R}/{paths.log_file('registration')}",
    conda:
        "../envs/plexgpu.yaml"
    threads: res("registration", "cpus_per_task")
    resources:
        **rule_resources("registration"),
    params:
        specs=[SPECS[c] for c in CYCLES],
        registration=config["registration"],
        shared_camera=config["basic"]["shared_camera"],
        device=DEVICE,
        accounting=ACCOUNTING,
    script:
        "../scripts/registration.py"
