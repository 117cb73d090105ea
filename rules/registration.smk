# Registration: one GPU job aligning every cycle's EDF to the reference cycle.


rule registration:
    input:
        expand(EDF, cycle=CYCLES, ch=CHANNELS),
    output:
        registered=expand(REGISTERED, cycle=CYCLES, ch=CHANNELS),
        shifts=SHIFTS,
        plex=PLEX,
    params:
        specs=[SPECS[c] for c in CYCLES],
        registration=config["registration"],
        device=DEVICE,
        accounting=ACCOUNTING,
    threads: res("registration", "cpus_per_task")
    resources:
        cpus_per_task=res("registration", "cpus_per_task"),
        mem_mb=res("registration", "mem_mb"),
        runtime=res("registration", "runtime"),
        **gpu_resources(per_cycle=False),
    conda:
        "../envs/plexgpu.yaml"
    log:
        f"{R}/logs/registration/registration.log",
    script:
        "../scripts/registration.py"
