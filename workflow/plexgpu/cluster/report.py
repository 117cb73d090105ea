"""``plexgpu report``: GPU usage stated honestly, and a report card per rule.

Per device model and MIG profile separately (never summed across them): the number of
allocations, elapsed time and the exact arithmetic of any GPU-hour total; a table per
account; a report card that compares what each rule used with what it asked for
(GPU utilisation, GPU memory, CPU efficiency, time). Allocation counts and elapsed time
come from ``sacct`` where the jobs ran on SLURM; device facts come from the jobs' own
records (``accounting/jobs/*.json``).
"""

from __future__ import annotations

import html
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .. import paths
from .accounting import load_records
from ..io.tiff import write_text_atomic
from .slurm import gres_gpus, parse_comment, parse_elapsed, parse_rss, sacct_by_ids, sacct_jobs

UTIL_LOW_PCT = 50
MEM_LOW_PCT = 40
CPU_EFF_LOW_PCT = 50
TIME_USED_LOW_PCT = 25


@dataclass
class StageUse:
    """One stage's own record inside an allocation: what the report card compares per rule."""
    rule: str
    elapsed_s: float
    time_limit_s: float | None   # the stage's own runtime request
    util_mean: float | None
    mem_peak_pct: float | None
    cpu_eff: float | None
    cpus: int | None
    device_used: bool
    start: float
    end: float


@dataclass
class Allocation:
    """One SLURM allocation (one job id): a single job, or a cycle's group job with its stages in
    pipeline order (``rule`` then reads e.g. ``stitch+deconvolve+edf``)."""
    rule: str
    cycle: str
    job_id: str
    account: str
    partition: str
    gpus: int
    elapsed_s: float
    time_limit_s: float | None
    state: str
    source: str              # "sacct" or "record"
    device_group: str        # e.g. "NVIDIA H200 (whole device)", "NVIDIA H100 3g.40gb MIG slice"
    device_short: str        # e.g. "H200", "H100 3g.40gb"
    device_used: bool
    unit: str                # "GPU-hours" or "slice-hours"
    start: float
    end: float
    max_rss: float | None
    stages: list[StageUse]   # the stages' own records (none for an allocation that wrote no record)


def _device(record: dict) -> tuple[str, str, bool, str]:
    d = record.get("device") or {}
    if not d.get("used"):
        return "no GPU device used", "none", False, "allocated-GPU-hours"
    model = d.get("model") or "unknown model"
    short = model.replace("NVIDIA ", "").split()[0] if model else "GPU"
    if d.get("kind") == "MIG slice":
        prof = d.get("mig_profile") or "unknown profile"
        return f"{model} {prof} MIG slice", f"{short} {prof}", True, "slice-hours"
    return f"{model} (whole device)", short, True, "GPU-hours"


NO_RECORD = "no job record (cancelled or killed before its job could write one)"


def _epoch(text: str) -> float:
    try:
        return datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return 0.0


def unrecorded(known_ids: set[str], run: str, workdir: Path) -> list[Allocation]:
    """The run's allocations that sacct knows and no job record names: a job cancelled or killed
    before it wrote its record still held its GPU, and is counted (marked as such)."""
    from .rerun import belongs

    out = []
    for r in sacct_jobs(start="now-30days"):
        if r["JobID"] in known_ids or not belongs(r, run, workdir):
            continue
        rule, cycle = parse_comment(r["Comment"])
        limit = parse_elapsed(r["Timelimit"]) if r["Timelimit"] not in ("", "UNLIMITED", "Partition_Limit") else None
        out.append(Allocation(
            rule=rule, cycle=cycle, job_id=r["JobID"], account=r["Account"], partition=r["Partition"],
            gpus=gres_gpus(r["AllocTRES"]), elapsed_s=parse_elapsed(r["Elapsed"]), time_limit_s=limit,
            state=r["State"].split()[0], source="sacct", device_group=NO_RECORD, device_short="unknown",
            device_used=False, unit="allocated-GPU-hours", start=_epoch(r["Start"]), end=_epoch(r["End"]),
            max_rss=parse_rss(r["MaxRSS"]), stages=[]))
    return out


def _stage_use(r: dict) -> StageUse:
    samples = r.get("gpu_samples") or {}
    runtime = (r.get("requested") or {}).get("runtime")
    return StageUse(rule=r["rule"], elapsed_s=r["elapsed_s"], time_limit_s=float(runtime) * 60 if runtime else None,
                    util_mean=samples.get("gpu_util_mean_pct"), mem_peak_pct=samples.get("gpu_mem_peak_pct"),
                    cpu_eff=r.get("cpu_efficiency_pct"), cpus=(r.get("requested") or {}).get("cpus_per_task"),
                    device_used=bool((r.get("device") or {}).get("used")), start=r["start"], end=r["end"])


def collect(accounting_dir: str | Path, use_sacct: bool = True, run: str | None = None,
            workdir: Path | None = None) -> list[Allocation]:
    """Every allocation: the jobs' own records joined with sacct, and (with ``run``, the run's job-name
    prefix) the run's allocations sacct knows that have no record."""
    records = load_records(accounting_dir)
    facts = sacct_by_ids([r["slurm"]["job_id"] for r in records]) if use_sacct else {}
    by_job: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_job[r["slurm"]["job_id"]].append(r)
    order = {name: i for i, name in enumerate(s.name for s in paths.PIPELINE)}
    out = []
    for jid, recs in by_job.items():
        recs.sort(key=lambda r: (order.get(r["rule"], len(order)), r["start"]))
        first, s = recs[0], facts.get(jid)
        group, short, used, unit = _device(first)
        stages = [_stage_use(r) for r in recs]
        if s:
            gpus, elapsed = gres_gpus(s["AllocTRES"]), parse_elapsed(s["Elapsed"])
            limit = parse_elapsed(s["Timelimit"]) if s["Timelimit"] not in ("", "UNLIMITED", "Partition_Limit") else None
            account, partition, state, source, rss = s["Account"], s["Partition"], s["State"], "sacct", s["MaxRSS_bytes"]
        else:   # no sacct: the stages' own elapsed times, one after another in the allocation
            gpus, elapsed = first.get("allocated_gpus", 0), sum(u.elapsed_s for u in stages)
            limits = [u.time_limit_s for u in stages]
            limit = sum(limits) if all(limits) else None
            account = first["slurm"].get("account") or "(none)"
            partition = first["slurm"].get("partition") or "(none)"
            failed = [r["status"] for r in recs if r["status"] != "completed"]
            state, source = (failed or [first["status"]])[0].upper(), "record"
            rss = max((r.get("peak_rss_bytes") or 0 for r in recs), default=0) or None
        out.append(Allocation(
            rule="+".join(u.rule for u in stages), cycle=first["cycle"], job_id=jid, account=account,
            partition=partition, gpus=gpus, elapsed_s=elapsed, time_limit_s=limit, state=state, source=source,
            device_group=group, device_short=short, device_used=used, unit=unit,
            start=min(u.start for u in stages), end=max(u.end for u in stages), max_rss=rss, stages=stages))
    if use_sacct and run:
        out += unrecorded({r["slurm"]["job_id"] for r in records}, run, Path(workdir or Path.cwd()))
    return out


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.3f} h"


def _group_by(allocs: list[Allocation], attr: str) -> list[tuple[str, list[Allocation]]]:
    """Allocations grouped by one attribute, groups sorted by it, order kept within a group."""
    groups: dict[str, list[Allocation]] = defaultdict(list)
    for a in allocs:
        groups[getattr(a, attr)].append(a)
    return sorted(groups.items())


def usage_statements(allocs: list[Allocation]) -> list[dict]:
    """One statement per device group, with its arithmetic: never summed across groups."""
    out = []
    for group, items in _group_by(allocs, "device_group"):
        total_elapsed = sum(a.elapsed_s for a in items)
        gpu_seconds = sum(a.gpus * a.elapsed_s for a in items)
        terms = " + ".join(f"{a.gpus} × {a.elapsed_s:.0f} s" for a in items)
        arithmetic = f"Σ (allocated GPUs × elapsed) = {terms} = {gpu_seconds:.0f} s = {gpu_seconds / 3600:.3f} h"
        n = len(items)
        allocations = "allocation" if n == 1 else "allocations"
        gpus = sorted({a.gpus for a in items})
        each = f"{gpus[0]} GPU" if len(gpus) == 1 else f"{gpus[0]}-{gpus[-1]} GPUs"
        first = items[0]
        if group == NO_RECORD:
            states = ", ".join(f"{k} {v}" for k, v in sorted(Counter(a.state for a in items).items()))
            text = (f"{n} {allocations} of this run that sacct knows have no job record ({states}): they held "
                    f"{each} each for {_hours(total_elapsed)} elapsed in total, {gpu_seconds / 3600:.3f} "
                    f"allocated-GPU-hours of a device no record names, calculated as {arithmetic}")
        elif not first.device_used and gpu_seconds == 0:
            text = (f"{n} job{'s' if n != 1 else ''} held no GPU (no SLURM GPU allocation) for "
                    f"{_hours(total_elapsed)} elapsed in total: 0 GPU-hours, calculated as {arithmetic}")
        elif not first.device_used:
            text = (f"{n} {allocations} held {each} each (SLURM gres/gpu) for {_hours(total_elapsed)} elapsed in "
                    f"total, but no GPU device was used by these jobs (compute.device = cpu): "
                    f"{gpu_seconds / 3600:.3f} allocated-GPU-hours of no device model, calculated as {arithmetic}")
        elif first.unit == "slice-hours":
            text = (f"We used {n} {allocations} of one {group} each, for {_hours(total_elapsed)} elapsed in total: "
                    f"{gpu_seconds / 3600:.3f} {first.device_short} slice-hours, calculated as {arithmetic}")
        else:
            model = group.replace(" (whole device)", "")
            text = (f"We used {n} {allocations} of one whole {model} each, for {_hours(total_elapsed)} elapsed in "
                    f"total: {gpu_seconds / 3600:.3f} {first.device_short} GPU-hours, calculated as {arithmetic}")
        out.append({"group": group, "allocations": n, "elapsed_s": total_elapsed, "gpu_seconds": gpu_seconds,
                    "unit": first.unit, "text": text})
    return out


def report_card(allocs: list[Allocation]) -> list[dict]:
    """Per rule (each stage of a cycle's group job on its own): what was used against what was asked
    for, with advice and its numbers."""
    cards = []
    for rule, items in _group_by([u for a in allocs for u in a.stages], "rule"):
        def mean(vals):
            return sum(vals) / len(vals) if vals else None
        util = mean([a.util_mean for a in items if a.util_mean is not None])
        mem = mean([a.mem_peak_pct for a in items if a.mem_peak_pct is not None])
        cpu = mean([a.cpu_eff for a in items if a.cpu_eff is not None])
        used = [100 * a.elapsed_s / a.time_limit_s for a in items if a.time_limit_s]
        time_pct = mean(used)
        cpus = max((a.cpus or 1) for a in items)
        advice = []
        if util is not None and util < UTIL_LOW_PCT:
            advice.append(f"GPU utilisation {util:.0f} % < {UTIL_LOW_PCT} %: data starvation; use more loader "
                          f"workers, up to cpus_per_task - 1 = {max(cpus - 1, 1)}")
        if mem is not None and mem < MEM_LOW_PCT:
            advice.append(f"GPU memory peak {mem:.0f} % < {MEM_LOW_PCT} %: room for bigger batches "
                          "(e.g. larger deconvolution.chunk_px)")
        if cpu is not None and cpu < CPU_EFF_LOW_PCT:
            busy = cpus * cpu / 100
            if cpus > 1 and math.ceil(busy) < cpus:
                advice.append(f"CPU efficiency {cpu:.0f} % < {CPU_EFF_LOW_PCT} % of {cpus} cores (about {busy:.1f} "
                              f"busy): cores requested but idle; ask for fewer (cpus_per_task = {math.ceil(busy)})")
            else:
                advice.append(f"CPU efficiency {cpu:.0f} % of {cpus} core{'s' if cpus > 1 else ''}: the job waits "
                              "on the GPU or on files, not on its CPU; nothing to take away")
        if time_pct is not None and time_pct < TIME_USED_LOW_PCT:
            longest = max(a.elapsed_s for a in items)
            advice.append(f"time used {time_pct:.0f} % < {TIME_USED_LOW_PCT} % of the request: ask for less "
                          f"(longest job {longest / 60:.1f} min; e.g. runtime = {max(1, math.ceil(2 * longest / 60))})")
        if all(not a.device_used for a in items):
            advice.append("no GPU device was used: GPU utilisation and memory were not measured")
        cards.append({"rule": rule, "jobs": len(items), "gpu_util_mean_pct": util, "gpu_mem_peak_pct": mem,
                      "cpu_efficiency_pct": cpu, "time_used_pct": time_pct, "advice": advice})
    return cards


def account_table(allocs: list[Allocation]) -> list[dict]:
    rows: dict[tuple, dict] = {}
    for a in allocs:
        key = (a.account, a.device_group)
        row = rows.setdefault(key, {"account": a.account, "device": a.device_group, "allocations": 0,
                                    "elapsed_s": 0.0, "gpu_seconds": 0.0})
        row["allocations"] += 1
        row["elapsed_s"] += a.elapsed_s
        row["gpu_seconds"] += a.gpus * a.elapsed_s
    return [rows[k] for k in sorted(rows)]


def _fmt(v, suffix=""):
    return "–" if v is None else f"{v:.0f}{suffix}"


def markdown(allocs: list[Allocation]) -> str:
    lines = ["# GPU usage (plexgpu report)", "",
             "Each device model and MIG profile is stated on its own line; unlike allocations are never added "
             "together. Allocation counts and elapsed times come from sacct where the jobs ran on SLURM.", ""]
    for st in usage_statements(allocs):
        lines += [f"- {st['text']}", ""]
    lines += ["## Allocations", "", "| rule | cycle | job | account | partition | device | GPUs | elapsed s | "
              "state | source |", "|---|---|---|---|---|---|---|---|---|---|"]
    for a in sorted(allocs, key=lambda a: a.start):
        lines.append(f"| {a.rule} | {a.cycle} | {a.job_id} | {a.account} | {a.partition} | {a.device_group} | "
                     f"{a.gpus} | {a.elapsed_s:.0f} | {a.state} | {a.source} |")
    lines += ["", "## Per account", "", "| account | device | allocations | elapsed h | GPU × elapsed h |",
              "|---|---|---|---|---|"]
    for r in account_table(allocs):
        lines.append(f"| {r['account']} | {r['device']} | {r['allocations']} | {r['elapsed_s'] / 3600:.3f} | "
                     f"{r['gpu_seconds'] / 3600:.3f} |")
    lines += ["", "## Report card", "", "| rule | jobs | GPU util % | GPU mem peak % | CPU efficiency % | "
              "time used % of request |", "|---|---|---|---|---|---|"]
    cards = report_card(allocs)
    for c in cards:
        lines.append(f"| {c['rule']} | {c['jobs']} | {_fmt(c['gpu_util_mean_pct'])} | {_fmt(c['gpu_mem_peak_pct'])} "
                     f"| {_fmt(c['cpu_efficiency_pct'])} | {_fmt(c['time_used_pct'])} |")
    lines.append("")
    for c in cards:
        for adv in c["advice"]:
            lines.append(f"- **{c['rule']}**: {adv}")
    return "\n".join(lines) + "\n"


def _timeline_svg(allocs: list[Allocation]) -> str:
    if not allocs:
        return ""
    t0, t1 = min(a.start for a in allocs), max(a.end for a in allocs)
    lanes = sorted({(a.account, a.device_group) for a in allocs})
    width, lane_h, left = 900, 16, 260
    scale = (width - left - 10) / max(t1 - t0, 1e-6)
    out = []
    y = 0
    colours = {s.name: s.colour for s in paths.PIPELINE}
    for lane in lanes:
        items = sorted([a for a in allocs if (a.account, a.device_group) == lane], key=lambda a: a.start)
        sub: list[float] = []  # end time per sub-row
        placed = []
        for a in items:
            k = next((i for i, e in enumerate(sub) if e <= a.start), None)
            if k is None:
                sub.append(a.end)
                k = len(sub) - 1
            else:
                sub[k] = a.end
            placed.append((k, a))
        out.append(f'<text x="0" y="{y + 12}" font-size="11">{html.escape(lane[0])} · '
                   f'{html.escape(lane[1])}</text>')
        for k, a in placed:   # the allocation in grey, each of its stages in its colour on it
            x = left + (a.start - t0) * scale
            w = max(1.0, (a.end - a.start) * scale)
            out.append(f'<rect x="{x:.1f}" y="{y + k * lane_h + 2}" width="{w:.1f}" height="{lane_h - 4}" '
                       f'fill="#999"><title>{html.escape(a.rule)} {a.cycle} job {a.job_id}: {a.elapsed_s:.0f} s'
                       f'</title></rect>')
            for u in a.stages:
                xs, ws = left + (u.start - t0) * scale, max(1.0, (u.end - u.start) * scale)
                out.append(f'<rect x="{xs:.1f}" y="{y + k * lane_h + 2}" width="{ws:.1f}" height="{lane_h - 4}" '
                           f'fill="{colours.get(u.rule, "#999")}"><title>{html.escape(u.rule)} {a.cycle} in job '
                           f'{a.job_id}: {u.elapsed_s:.0f} s</title></rect>')
        y += max(1, len(sub)) * lane_h + 8
    # the time axis: ticks at a round step, minutes from the first allocation's start
    span = max(t1 - t0, 1e-6)
    step = next(s for s in (10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 1e9) if span / s <= 10)
    out.append(f'<line x1="{left}" y1="{y}" x2="{width - 10}" y2="{y}" stroke="#333"/>')
    k = 0
    while k * step <= span:
        x = left + k * step * scale
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#333"/>'
                   f'<text x="{x:.1f}" y="{y + 15}" font-size="10" text-anchor="middle">{k * step / 60:g} min</text>')
        k += 1
    y += 20
    legend = " ".join(f'<tspan fill="{c}">■ {r}</tspan>' for r, c in colours.items())
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 24}">{"".join(out)}'
            f'<text x="{left}" y="{y + 16}" font-size="11">{legend} · time since the first allocation started'
            f'</text></svg>')


def _bars_svg(allocs: list[Allocation]) -> str:
    items = sorted(((u, a.cycle) for a in allocs for u in a.stages), key=lambda uc: uc[0].start)
    h, width = 14, 700
    out = []
    for i, (u, cycle) in enumerate(items):
        y = i * h
        out.append(f'<text x="0" y="{y + 11}" font-size="10">{html.escape(u.rule)} {cycle}</text>')
        for j, (v, colour) in enumerate(((u.util_mean, "#4c78a8"), (u.mem_peak_pct, "#f58518"))):
            if v is not None:
                out.append(f'<rect x="{160 + j * 270}" y="{y + 2}" width="{2.5 * v:.1f}" height="{h - 4}" '
                           f'fill="{colour}"/>')
            else:
                out.append(f'<text x="{160 + j * 270}" y="{y + 11}" font-size="10">not measured</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{len(items) * h + 20}">'
            f'{"".join(out)}<text x="160" y="{len(items) * h + 14}" font-size="11">GPU utilisation % (blue) · '
            f'GPU memory peak % (orange)</text></svg>')


def write_report(results_dir: str | Path, use_sacct: bool = True, run: str | None = None,
                 workdir: Path | None = None) -> tuple[Path, Path, list[Allocation]]:
    results_dir = Path(results_dir)
    allocs = collect(results_dir / "accounting" / "jobs", use_sacct=use_sacct, run=run, workdir=workdir)
    md = markdown(allocs)
    md_path = results_dir / "report" / "gpu_usage.md"
    html_path = results_dir / "report" / "gpu_usage.html"
    write_text_atomic(md_path, md)
    body = "".join(f"<p>{html.escape(st['text'])}</p>" for st in usage_statements(allocs))
    cards = "".join(f"<li><b>{html.escape(c['rule'])}</b>: {html.escape(adv)}</li>"
                    for c in report_card(allocs) for adv in c["advice"])
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>plexgpu GPU usage</title></head>"
            "<body style='font-family:sans-serif;margin:2em'><h1>GPU usage</h1>" + body +
            "<h2>Timeline of jobs per account and device</h2>" + _timeline_svg(allocs) +
            "<h2>Utilisation and memory per job</h2>" + _bars_svg(allocs) +
            f"<h2>Report card</h2><ul>{cards}</ul><p>Tables: {md_path.name}</p></body></html>")
    write_text_atomic(html_path, page)
    return md_path, html_path, allocs
