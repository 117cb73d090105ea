"""The cluster side: cycle -> GPU account assignment, SLURM access, the GPU guard, per-job
accounting and the GPU-usage report, the makespan simulator, status / cancel / rerun."""
