"""GPU allocations per cycle and the GPU time spent outside stage work, on the real local SLURM cluster
(tests/slurm/start_cluster.sh; its GPUs are fake, so the stages run with compute.device cpu).

Runs `snakemake registration` with the project's SLURM profile on a synthetic data set of N cycles and
reads, per allocation: sacct's Start/End/Elapsed (1 s resolution), the stages its jobs' accounting
records name (their elapsed: stage seconds, from the job context's start to its end), and the first
timestamped line of its first stage's log (start-up = that line - sacct Start).

    python bench/allocation_startup.py --cycles 4 30 --label after
    python bench/allocation_startup.py --cycles 3 --grid 6 --tile 192 --channels 2 --label after   # demo size

Where a stage fails (the synthetic data) the run stops with its log: the numbers are of complete runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

import yaml
from common import HERE, RESULTS

from plexgpu.cluster.accounting import load_records
from plexgpu.cluster.rerun import run_options, run_prefix
from plexgpu.cluster.slurm import parse_elapsed, sacct_jobs
from plexgpu.image.synth import SynthDataset, SynthSpec

ACCOUNTS = [{"name": "clive", "gpu_slots": 3, "partition": "hpg-b200"},
            {"name": "maigan", "gpu_slots": 2, "partition": "hpg-b200"}]
OUT = RESULTS / "allocation_startup.json"


def first_log_time(log: Path) -> float | None:
    for line in log.read_text().splitlines():
        try:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
    return None


def run(cycles: int, grid: int, tile: int, channels: int, jobs: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="plexgpu-alloc-", dir="/tmp"))
    SynthDataset(SynthSpec(cycles=cycles, rows=grid, cols=grid, tile=(tile, tile), z_planes=5, channels=channels,
                           seed=5)).write(tmp / "raw")
    small = {"cpus_per_task": 1, "mem_mb": 400, "runtime": 10}
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "raw_dir": str(tmp / "raw"), "results_dir": str(tmp / "results"), "compute": {"device": "cpu"},
        "accounts": ACCOUNTS, "deconvolution": {"iterations": 2},
        "resources": {r: dict(small) for r in ("stitch", "deconvolve", "edf", "registration", "qc")}}))
    prefix = f"plexgpu-b{uuid.uuid4().hex[:6]}"
    prof = tmp / "profile"
    prof.mkdir()
    data = yaml.safe_load((HERE.parent / "profiles/slurm/config.v8+.yaml").read_text())
    data["slurm-jobname-prefix"] = prefix
    (prof / "config.v8+.yaml").write_text(yaml.safe_dump(data))
    run_name = run_prefix(prefix, tmp / "results", tmp)
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "snakemake", "registration", "--configfile", str(cfg),
                          "--profile", str(prof), *run_options(run_name, tmp / "results", tmp), "-j", str(jobs),
                          "-s", str(HERE.parent / "Snakefile"), "-d", str(tmp),
                          "--slurm-init-seconds-before-status-checks", "3", "--latency-wait", "5",
                          "--slurm-keep-successful-logs"],
                         capture_output=True, text=True)
    wall = time.time() - t0
    if res.returncode != 0:
        sys.exit(res.stdout[-3000:] + res.stderr[-3000:])
    time.sleep(2)  # sacct's last End
    sacct = {r["JobID"]: r for r in sacct_jobs(start=datetime.now().strftime("%Y-%m-%d"))
             if r["JobName"].startswith(run_name + "_")}
    by_job: dict[str, list[dict]] = {}
    for rec in load_records(tmp / "results/accounting/jobs"):
        by_job.setdefault(rec["slurm"]["job_id"], []).append(rec)
    allocs = []
    for jid, recs in by_job.items():
        recs.sort(key=lambda r: r["start"])
        s = sacct[jid]
        first = recs[0]
        log = tmp / "results/logs" / first["rule"] / f"{first['cycle'] or first['rule']}.log"
        start = datetime.fromisoformat(s["Start"]).timestamp()
        t_log = first_log_time(log)
        allocs.append({"job_id": jid, "stages": [r["rule"] for r in recs], "cycle": first["cycle"],
                       "allocated_s": parse_elapsed(s["Elapsed"]),
                       "stage_s": sum(r["elapsed_s"] for r in recs),
                       "startup_s": None if t_log is None else t_log - start,
                       "between_stages_s": sum(b["start"] - a["end"] for a, b in zip(recs, recs[1:])),
                       "after_last_stage_s": datetime.fromisoformat(s["End"]).timestamp() - recs[-1]["end"]})
    cycle_allocs = [a for a in allocs if a["cycle"]]
    allocated = sum(a["allocated_s"] for a in allocs)
    stage = sum(a["stage_s"] for a in allocs)
    startups = [a["startup_s"] for a in allocs if a["startup_s"] is not None]
    return {"cycles": cycles, "jobs": jobs, "grid": f"{grid}x{grid}", "tile": tile, "channels": channels, "wall_s": wall,
            "allocations": len(allocs), "allocations_per_cycle": len(cycle_allocs) / cycles,
            "startup_median_s": statistics.median(startups), "startup_max_s": max(startups),
            "startup_min_s": min(startups),
            "after_last_stage_median_s": statistics.median(a["after_last_stage_s"] for a in allocs),
            "between_stages_median_s": statistics.median(a["between_stages_s"] for a in cycle_allocs),
            "allocated_s": allocated, "stage_s": stage, "stage_over_allocated": stage / allocated,
            "per_allocation": sorted(allocs, key=lambda a: int(a["job_id"]))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, nargs="+", default=[4])
    ap.add_argument("--grid", type=int, default=3, help="tiles per row and column")
    ap.add_argument("--tile", type=int, default=96)
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("-j", "--jobs", type=int, default=5,
                    help="GPU jobs at once (5: the accounts' slots; 1: each allocation alone on the test machine's "
                         "2 cores, as a job has its own cores on a real node)")
    ap.add_argument("--label", required=True, help="e.g. before / after: the row's name in the results file")
    args = ap.parse_args()
    data = json.loads(OUT.read_text()) if OUT.exists() else {"benchmark": "allocation_startup", "runs": {}}
    for n in args.cycles:
        row = run(n, args.grid, args.tile, args.channels, args.jobs)
        size = f"{n} cycles {args.grid}x{args.grid} x {args.tile} px x {args.channels} ch -j {args.jobs}"
        data["runs"][f"{args.label} {size}"] = dict(row, when=time.strftime("%Y-%m-%d %H:%M"))
        print(json.dumps({k: v for k, v in row.items() if k != "per_allocation"}, indent=1))
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
