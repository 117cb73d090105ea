"""The ``plexgpu`` command line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import __version__
from .io.raw import GRID_ORDERS


def _console():
    """A rich console; where output is not a terminal (SLURM logs, pipes) wide enough that no table
    value is cut (rich sizes its tables to 80 columns there: cyc001_reg0... hid cycle 1 from 11)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=1000, soft_wrap=True)


def _fail(message: str) -> int:
    print(f"plexgpu: error: {message}", file=sys.stderr)
    return 2


def _pair(value: str, option: str) -> tuple[int, int]:
    """'ROWSxCOLS' -> (rows, cols), two positive integers, or one line naming the option."""
    try:
        a, b = (int(v) for v in value.lower().split("x"))
    except ValueError:
        raise SystemExit(f"plexgpu: error: {option} must be two positive integers like 3x3, not {value!r}") from None
    if a < 1 or b < 1:
        raise SystemExit(f"plexgpu: error: {option} must be two positive integers like 3x3, not {value!r}")
    return a, b


def cmd_synth(args) -> int:
    from .image.synth import SynthDataset, SynthSpec

    rows, cols = _pair(args.grid, "--grid")
    th, tw = _pair(args.tile, "--tile")
    out_dir = Path(args.out)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not args.force:
        return _fail(f"{out_dir} exists and is not empty; plexgpu synth writes a whole dataset into an empty folder "
                     "(--force to write over it)")
    try:
        spec = SynthSpec(cycles=args.cycles, rows=rows, cols=cols, tile=(th, tw), z_planes=args.z,
                         channels=args.channels, seed=args.seed, overlap=args.overlap, order=args.order,
                         blank_tiles=tuple(args.blank_tiles or ()))
        for name, value, low in (("--cycles", args.cycles, 1), ("--z", args.z, 1), ("--channels", args.channels, 1)):
            if value < low:
                raise ValueError(f"{name} must be at least {low}, not {value}")
        if not 0 <= args.overlap < 1:
            raise ValueError(f"--overlap must be a fraction in [0, 1), not {args.overlap}")
        if any(t < 1 or t > rows * cols for t in spec.blank_tiles):
            raise ValueError(f"--blank-tiles must be tile numbers 1..{rows * cols}")
    except ValueError as exc:
        return _fail(str(exc))
    t0 = time.perf_counter()
    out = SynthDataset(spec).write(args.out)
    n = spec.cycles * rows * cols * spec.z_planes * spec.channels
    print(f"wrote {n} tiles ({spec.cycles} cycles x {rows}x{cols} tiles x {spec.z_planes} z x "
          f"{spec.channels} channels of {th}x{tw}) + truth/ to {out} in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_validate(args) -> int:
    from rich.table import Table

    from .config import load_config
    from .experiment import resolve_experiment

    t0 = time.perf_counter()
    config = load_config(args.configfile, slots=True)
    exp = resolve_experiment(config, read_headers=True, workers=args.workers)
    table = Table(title=f"plexgpu: {len(exp.cycles)} cycles in {exp.raw_dir}")
    for col in ("cycle", "folder", "tiles", "z-planes", "channels", "markers"):
        table.add_column(col)
    for c in exp.cycles:
        inv = exp.inventories[c]
        table.add_row(str(c), inv.folder.name, f"{exp.n_tiles} ({exp.rows}x{exp.cols} {exp.order})",
                      str(inv.z_planes), ",".join(f"CH{ch}" for ch in inv.channels),
                      ", ".join(exp.marker_names(c)))
    console = _console()
    console.print(table)
    console.print(f"tiles {exp.tile_shape} {exp.dtype}, overlap {exp.overlap:.0%}, pixel "
                  f"{exp.pixel_size_um} µm, z-step {exp.z_step_um} µm; compute.device = "
                  f"{config['compute']['device']}; checked in {time.perf_counter() - t0:.1f} s")
    from .cluster.requests import request_refusals

    warnings = []
    if config["accounts"]:              # the slots the README promises validate shows
        from .cluster.assignment import build_cycle_assignment

        warnings = slots_table(console, config["accounts"], build_cycle_assignment(exp.cycle_keys,
                                                                                   config["accounts"]))[2]
    refused, more = request_refusals(config)
    for w in warnings + more:
        console.print(f"[yellow]warning: {w}[/]")
    return _refused(console, "validate", refused)


def _refused(console, command: str, refused: list[str]) -> int:
    """Print each request SLURM would refuse (or never start) as an error; exit status 3 if any."""
    for r in refused:
        console.print(f"[red]error: {r}[/]")
    if refused:
        console.print(f"plexgpu {command}: {len(refused)} request(s) SLURM would refuse or never start: fix them in "
                      "the config before running (exit 3)")
    return 3 if refused else 0


def snakemake_command(configfiles: list[str], target: str, jobs: int, options: list[str],
                      profile: str = "profiles/slurm") -> str:
    """The exact command line: targets first (--configfile takes several values), the run's options
    (its job-name prefix and SLURM log folder: status / cancel / rerun act on this data set only),
    -j = free GPU slots."""
    import shlex

    return (f"snakemake {shlex.quote(target)} --configfile {' '.join(shlex.quote(c) for c in configfiles)} "
            f"--profile {shlex.quote(str(profile))} {' '.join(shlex.quote(str(o)) for o in options)} -j {jobs}")


def _minutes(text: str) -> tuple[float, ...]:
    """'8,12,1.5' -> one positive number of minutes per per-cycle stage of the registry, for argparse:
    one line otherwise."""
    from .paths import cycle_stages

    stages = cycle_stages()
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != len(stages) or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"{len(stages)} positive minutes, one per stage {','.join(stages)}, "
                                         f"not {text!r}")
    return values


def _minutes_text(kind: str) -> str:
    from .cluster.simulate import reference_minutes

    return ",".join(f"{m:g}" for m in reference_minutes(kind))


def cmd_simulate(args, config) -> int:
    from .cluster.simulate import simulate

    if args.cycles is None:
        from .experiment import resolve_experiment

        n = len(resolve_experiment(config).cycles)
    else:
        n = args.cycles
    policies = ["gpu-only", "cpu-fallback"] if args.policy == "both" else [args.policy]
    for policy in policies:
        res = simulate(n, config["accounts"], args.gpu_minutes, policy, args.cpu_minutes,
                       args.cpu_slots, args.registration_minutes)
        print(res.summary())
    return 0


def cmd_plan(args) -> int:
    from rich.table import Table

    from .cluster.assignment import (build_cycle_assignment, check_known_accounts, registration_slot,
                             total_slots)
    from .config import load_config
    from .experiment import resolve_experiment
    from .cluster.slurm import user_accounts
    from .paths import PIPELINE, cycle_stages

    config = load_config(args.configfile, slots=True)
    if args.simulate:
        return cmd_simulate(args, config)
    exp = resolve_experiment(config)
    accounts = config["accounts"]
    assignment = build_cycle_assignment(exp.cycle_keys, accounts)
    check_known_accounts(accounts, user_accounts())
    reg = registration_slot(accounts)
    console = _console()
    table = Table(title=f"GPU-only plan: {len(exp.cycles)} cycles, every image job on one GPU")
    for col in ("cycle", "account", "partition", "stages"):
        table.add_column(col)
    for key, slot in assignment.items():
        table.add_row(key, slot.account, slot.partition or "(default)", " -> ".join(cycle_stages()))
    table.add_row("all", reg.account, reg.partition or "(default)",
                  ", ".join(s.name for s in PIPELINE if not s.per_cycle and s.gpu))
    console.print(table)
    free_total, cap_total, warnings = slots_table(console, accounts, assignment)
    total = total_slots(accounts)
    from .cluster.requests import request_refusals

    refused, more = request_refusals(config)
    for w in warnings + more:
        console.print(f"[yellow]warning: {w}[/]")
    _memory_table(console, config, exp)
    waves = -(-len(assignment) // total)
    console.print(f"{len(assignment)} cycles on {total} GPU slots: {waves} wave(s); overflow cycles wait in "
                  "SLURM for a GPU of their account (no CPU fallback).")
    # -j: every slot the accounts may hold (SLURM's limits), not what is free this minute: jobs beyond
    # what is free pend in SLURM and start as GPUs free up (a second data set planned while a first
    # runs would otherwise keep -j 1 for its whole run)
    jobs = cap_total
    if free_total < cap_total:
        console.print(f"{cap_total - free_total} of the {cap_total} GPU slots are held now by your running jobs: "
                      f"this run's extra jobs pend in SLURM until they free up (-j {cap_total})")
    if config["compute"]["device"] != "gpu":
        console.print("[yellow]compute.device = cpu: jobs hold GPUs but compute on the CPU (testing only)[/]")
    from .config import REPO_ROOT
    from .cluster.rerun import profile_run, run_options

    run = profile_run(REPO_ROOT / "profiles" / "slurm", exp.results_dir, Path.cwd())
    options = run_options(run, exp.results_dir, Path.cwd())
    print(snakemake_command(args.configfile, args.target, jobs, options))
    # QC under the same run prefix and log folder: its jobs are this data set's, so they never block
    # another data set's rerun (CPU only; it reads what exists, so run it after the run, failed or not)
    print(snakemake_command(args.configfile, "qc", len(exp.cycle_keys), options))
    return _refused(console, "plan", refused)


def slots_table(console, accounts: list[dict], assignment: dict) -> tuple[int, int, list[str]]:
    """Print each account's GPU slots (config, SLURM's limit for you, in use by your jobs, free, cycles);
    returns (free, cap, warnings): cap = what SLURM's limits let the accounts hold together."""
    from rich.table import Table

    from .cluster.assignment import total_slots
    from .cluster.slurm import gpu_limit, gpus_in_use

    slots = Table(title="GPU slots per account (config, SLURM's limit for you, held now by your running jobs)")
    for col in ("account", "gpu_slots", "SLURM limit", "in use", "free", "cycles"):
        slots.add_column(col)
    in_use = gpus_in_use()
    free_total, cap_total, warnings = 0, 0, []
    for a in accounts:
        n = sum(1 for s in assignment.values() if s.account == a["name"])
        limit, source = gpu_limit(a["name"])
        used = in_use.get(a["name"], 0)
        cap = a["gpu_slots"] if limit is None else min(a["gpu_slots"], limit)
        free = max(cap - used, 0)
        free_total += free
        cap_total += cap
        if limit is not None and a["gpu_slots"] > limit:
            warnings.append(f"account {a['name']}: gpu_slots {a['gpu_slots']} but SLURM lets you hold {limit} "
                            f"({source}): jobs beyond it pend (AssocGrpGRES/QOSGrpGRES); set gpu_slots: auto or {limit}")
        said = f"auto → {a['gpu_slots']}" if a.get("gpu_slots_from") else str(a["gpu_slots"])
        slots.add_row(a["name"], said, "none found" if limit is None else f"{limit} ({source})", str(used),
                      str(free), str(n))
    slots.add_row("total", str(total_slots(accounts)), "", str(sum(in_use.get(a["name"], 0) for a in accounts)),
                  str(free_total), str(len(assignment)))
    console.print(slots)
    return free_total, cap_total, warnings


def _memory_table(console, config: dict, exp) -> None:
    """Each GPU stage's predicted peak device memory for this data and its chunk settings, against the
    memory of each account partition's GPU (sinfo's GRES type); one warning line where it does not fit,
    naming the config key that brings it under."""
    from rich.table import Table

    from . import gpu_memory as gm
    from .cluster.slurm import partition_limits
    from .experiment import cycle_spec
    from .io.tiff import read_tiff_header

    spec = cycle_spec(exp, exp.cycles[0])
    tile = read_tiff_header(spec.tile_paths(spec.channels[0], 1)[0])[0]
    devices = {}
    for a in config["accounts"]:
        lim = partition_limits(a["partition"]) if a.get("partition") else None
        for t in (lim or {}).get("gpu_types") or ["(type not given)"]:
            devices[(a["partition"], t)] = gm.device_bytes(t) if t != "(type not given)" else None
    peaks = gm.cycle_peaks(spec, config, tile, {k: v for k, v in devices.items() if v})
    mosaic, stitch, edf, reg = peaks["mosaic"], peaks["stitch"], peaks["edf"], peaks["registration"]
    table = Table(title=f"GPU memory per stage (cycle of {spec.rows}x{spec.cols} tiles of {tile[0]}x{tile[1]}, "
                        f"{len(spec.channels)} ch, {spec.z_planes} z; mosaic {mosaic[0]}x{mosaic[1]})")
    for col in ("stage", "predicted peak", "on"):
        table.add_column(col)
    table.add_row("stitch", f"{stitch / 1e9:.1f} GB", f"basic.working_size = {config['basic']['working_size']}")
    table.add_row("edf", f"{edf / 1e9:.1f} GB", "one mosaic plane at a time")
    table.add_row("registration", f"{reg / 1e9:.1f} GB", "one job for all cycles, a mosaic plane at a time")
    warn = []
    for (part, t), mem in devices.items():
        if mem is None:
            table.add_row("deconvolve", "-", f"partition {part}, GPU {t}: memory not known, chunks follow the "
                                             "free memory it finds")
            continue
        plan = peaks["deconvolve"][(part, t)]
        table.add_row("deconvolve", f"{plan['peak_bytes'] / 1e9:.1f} GB",
                      f"partition {part}, GPU {t} ({mem / 1e9:.0f} GB): {plan['chunk']}-px chunks")
        for stage, peak, key in (("stitch", stitch, "basic.working_size"), ("edf", edf, None), ("registration", reg, None),
                                 ("deconvolve", plan["peak_bytes"] if plan["smallest"] else 0, None)):
            if peak > mem:
                warn.append(f"{stage} needs {peak / 1e9:.1f} GB of GPU memory but partition {part}'s GPU {t} has "
                            f"{mem / 1e9:.0f} GB: " + (f"lower {key}" if key else "give it a partition with larger "
                                                        "GPUs"))
    console.print(table)
    for w in warn:
        console.print(f"[yellow]warning: {w}[/]")


def cmd_verify_gpu(args) -> int:
    from .cluster.gpu import GPUUnavailable, require_gpu

    try:
        facts = require_gpu()
    except GPUUnavailable as exc:
        print(f"plexgpu verify-gpu: FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"plexgpu verify-gpu: OK: {facts.name}, {facts.total_memory_bytes / 2**30:.1f} GiB, "
          f"{'MIG slice' if facts.mig else 'whole device'}, UUID {facts.uuid}, "
          f"CUDA_VISIBLE_DEVICES={facts.cuda_visible_devices}")
    return 0


def cmd_report(args) -> int:
    from .cluster.report import usage_statements, write_report
    from .cluster.rerun import profile_run

    config, exp, workdir, profile = _run_context(args)
    run = profile_run(profile, exp.results_dir, workdir)
    md, page, allocs = write_report(config["results_dir"], use_sacct=not args.no_sacct, run=run, workdir=workdir)
    if not allocs:
        print(f"plexgpu report: no accounting records under {config['results_dir']}/accounting/jobs yet")
        return 1
    for st in usage_statements(allocs):
        print(st["text"])
    print(f"report: {md} and {page}")
    return 0


def _run_context(args, slots: bool = False):
    from .config import load_config
    from .experiment import resolve_experiment

    config = load_config(args.configfile, slots=slots)
    exp = resolve_experiment(config)
    workdir = Path(args.directory).resolve()
    return config, exp, workdir, Path(args.profile)


def cmd_status(args) -> int:
    from rich.table import Table

    from .cluster.rerun import profile_run, status

    config, exp, workdir, profile = _run_context(args)
    run = profile_run(profile, exp.results_dir, workdir)
    states = status(exp.results_dir, workdir, exp.cycle_keys, exp.channels, run)
    table = Table(title=f"plexgpu status: {exp.results_dir} (jobs {run}_*)")
    for col in ("cycle", "stage", "state", "detail"):
        table.add_column(col)
    colour = {"done": "green", "running": "cyan", "failed": "red", "incomplete": "yellow", "damaged": "red"}
    for s in states:
        c = colour.get(s.state, "white")
        table.add_row(s.cycle, s.stage, f"[{c}]{s.state}[/]", s.detail)
    _console().print(table)
    from .cluster.rerun import live_coordinators

    if any(s.state == "running" for s in states) and not live_coordinators(workdir, args.configfile):
        print("no coordinator of this data set runs on this host: the running jobs finish their stages, but "
              f"nothing submits the next ones; plexgpu rerun registration --configfile {' '.join(args.configfile)} "
              "(it cancels them first)")
    return 0


def cmd_cancel(args) -> int:
    from .cluster.rerun import cancel_data_set, profile_prefix, profile_run, unattributed_jobs
    from .cluster.slurm import parse_comment

    _, exp, workdir, profile = _run_context(args)
    jobs, alive = cancel_data_set(profile_run(profile, exp.results_dir, workdir), workdir, args.configfile)
    for j in jobs:
        rule, wc = parse_comment(j["Comment"])
        print(f"cancelled job {j['JobID']} ({rule} {wc}, account {j['Account']}, was {j['State']})")
    print(f"{len(jobs)} job(s) of this data set ({exp.results_dir}) cancelled; none left in squeue")
    for pid in alive:
        print(f"coordinator PID {pid} still runs: it submits no further job and exits when it next asks SLURM "
              f"about its jobs (or kill {pid})")
    loose = unattributed_jobs(profile_prefix(profile), workdir)
    if loose:
        print(f"not touched: job(s) {', '.join(j['JobID'] for j in loose)}, started from {workdir} without a run "
              f"prefix: plexgpu cannot tell which data set they belong to (scancel them yourself if they are this "
              "one's)")
    return 0


def cmd_rerun(args) -> int:
    from .cluster.assignment import total_slots
    from .cluster.rerun import rerun

    config, exp, workdir, profile = _run_context(args, slots=True)
    jobs = total_slots(config["accounts"]) if config["accounts"] else 1
    return rerun(args.configfile, args.target, workdir, profile, jobs, exp.results_dir, exp.cycle_keys,
                 exp.channels, args.snakemake_args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="plexgpu", description=__doc__)
    p.add_argument("--version", action="version", version=f"plexgpu {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("synth", help="write a synthetic CODEX dataset with ground truth")
    s.add_argument("out")
    s.add_argument("--cycles", type=int, default=3)
    s.add_argument("--grid", default="3x3", help="ROWSxCOLS")
    s.add_argument("--tile", default="256x256", help="HxW pixels")
    s.add_argument("--z", type=int, default=5)
    s.add_argument("--channels", type=int, default=2)
    s.add_argument("--overlap", type=float, default=0.3)
    s.add_argument("--order", choices=GRID_ORDERS, default="snake", metavar="ORDER",
                   help="tile numbering (config key grid.order): snake, rows, or <kind>-<corner> as in the schema")
    s.add_argument("--blank-tiles", type=int, nargs="*")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--force", action="store_true", help="write into a folder that is not empty")
    s.set_defaults(func=cmd_synth)

    v = sub.add_parser("validate", help="check config and raw data; print a summary")
    v.add_argument("--configfile", nargs="+", required=True)
    v.add_argument("--workers", type=int, default=8, help="threads reading TIFF headers")
    v.set_defaults(func=cmd_validate)

    pl = sub.add_parser("plan", help="cycle -> GPU account table, slot totals and the snakemake command")
    pl.add_argument("--configfile", nargs="+", required=True)
    pl.add_argument("--target", default="registration")
    pl.add_argument("--simulate", action="store_true", help="simulate the run's makespan instead")
    pl.add_argument("--policy", choices=["gpu-only", "cpu-fallback", "both"], default="both")
    pl.add_argument("--cycles", type=int, help="number of cycles (default: those found in raw_dir)")
    from .paths import cycle_stages

    stage_list = ",".join(cycle_stages())
    pl.add_argument("--gpu-minutes", default=_minutes_text("gpu"), type=_minutes, help=f"{stage_list} minutes on a GPU")
    pl.add_argument("--cpu-minutes", default=_minutes_text("cpu"), type=_minutes,
                    help=f"{stage_list} minutes on a CPU slot")
    pl.add_argument("--cpu-slots", type=int, default=1)
    pl.add_argument("--registration-minutes", type=float, default=0.0)
    pl.set_defaults(func=cmd_plan)

    r = sub.add_parser("report", help="GPU usage per device model / MIG profile with the arithmetic, report card")
    r.add_argument("--configfile", nargs="+", required=True)
    r.add_argument("--no-sacct", action="store_true", help="use the jobs' own records only (no SLURM here)")
    r.set_defaults(func=cmd_report)

    from .config import REPO_ROOT

    r.add_argument("--directory", "-d", default=".", help="the workflow's working directory")
    r.add_argument("--profile", default=str(REPO_ROOT / "profiles" / "slurm"))

    for name, helptext, func in (
            ("status", "per cycle and stage: done / running / failed (sacct state) / not started", cmd_status),
            ("cancel", "scancel this workflow's jobs (job-name prefix AND working directory) and wait", cmd_cancel),
            ("rerun", "cancel stale jobs, unlock, rerun only what is unfinished (--rerun-incomplete)", cmd_rerun)):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("--configfile", nargs="+", required=True)
        c.add_argument("--directory", "-d", default=".", help="the workflow's working directory")
        c.add_argument("--profile", default=str(REPO_ROOT / "profiles" / "slurm"))
        if name == "rerun":
            c.add_argument("target", nargs="?", default="registration",
                           help="snakemake target (default registration); arguments after -- go to snakemake")
        c.set_defaults(func=func)

    g = sub.add_parser("verify-gpu", help="check this job's GPU the way every GPU job does (devel partitions)")
    g.set_defaults(func=cmd_verify_gpu)
    return p


def main(argv: list[str] | None = None) -> int:
    from .cluster.assignment import AssignmentError
    from .cluster.slurm import SlurmError
    from .config import ConfigError
    from .io.raw import RawDataError
    from .io.tiff import TiffReadError

    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    args = build_parser().parse_args(argv)
    args.snakemake_args = extra
    try:
        return args.func(args)
    except (ConfigError, RawDataError, TiffReadError, AssignmentError) as exc:
        return _fail(str(exc))
    except SlurmError as exc:          # e.g. no controller: said in one line, nothing touched
        return _fail(f"{exc} (is the SLURM controller up? `sinfo` asks it)")


if __name__ == "__main__":
    sys.exit(main())
