# Registration: one GPU job aligning every cycle's EDFs to the reference cycle (shifts measured on the
# quantification EDF, applied to both).


rule registration:
    input:
        edf=expand(EDF, cycle=CYCLES, ch=CHANNELS),
        edf_deconvolved=expand(EDF_DECONVOLVED, cycle=CYCLES, ch=CHANNELS),
    output:
        registered=expand(REGISTERED, cycle=CYCLES, ch=CHANNELS),
        registered_deconvolved=expand(REGISTERED_DECONVOLVED, cycle=CYCLES, ch=CHANNELS),
        shifts=SHIFTS,
        plex=PLEX,
        plex_deconvolved=PLEX_DECONVOLVED,
        markers=MARKERS,
    log:
        f"{R}/logs/registration/registration.log",
    conda:
        "../envs/plexgpu.yaml"
    threads: res("registration", "cpus_per_task")
    resources:
        **rule_resources("registration"),
    params:
        specs=[SPECS[c] for c in CYCLES],
        registration=config["registration"],
        device=DEVICE,
        accounting=ACCOUNTING,
    script:
        "../scripts/registration.py"
