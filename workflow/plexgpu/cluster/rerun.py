"""After scancel, a killed coordinator or a crash: see where a run stands, cancel its stale
jobs, and rerun exactly what is unfinished, with nothing stale racing the new run.

A run is one data set: its jobs are named ``<profile prefix>-<8 hex of its results folder>_<uuid>``
(``run_prefix``; `plexgpu plan` prints the snakemake command with that ``--slurm-jobname-prefix``,
`plexgpu rerun` passes it) and run in its working directory. status, cancel, rerun and the
live-coordinator check act on that run only: two data sets processed from one checkout never
touch each other's jobs. Jobs named with the bare profile prefix (a run started without the
run's prefix) cannot be told apart: they are reported, never cancelled, and rerun refuses to
start beside them (they could race the new jobs).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from .. import paths

from . import slurm
from .locks import lock_folder, remove_stale_locks
from ..config import REPO_ROOT
from ..io.tiff import damaged, first_damaged

def profile_prefix(profile: str | Path) -> str:
    cfg = Path(profile) / "config.v8+.yaml"
    data = yaml.safe_load(cfg.read_text()) if cfg.is_file() else {}
    return str((data or {}).get("slurm-jobname-prefix") or "")


def run_prefix(prefix: str, results_dir: Path, workdir: Path) -> str:
    """The job-name prefix of the run whose results go to ``results_dir`` (relative: to ``workdir``)."""
    folder = results_dir if Path(results_dir).is_absolute() else Path(workdir) / results_dir
    tag = hashlib.sha1(os.path.realpath(folder).encode()).hexdigest()[:8]
    return f"{prefix or 'plexgpu'}-{tag}"


def profile_run(profile: str | Path, results_dir: Path, workdir: Path) -> str:
    """The job-name prefix of the run launched with ``profile`` whose results go to ``results_dir``."""
    return run_prefix(profile_prefix(profile), results_dir, workdir)


def run_options(run: str, results_dir: Path, workdir: Path) -> list[str]:
    """The slurm-plugin options that keep one data set's run apart from another's in the same working
    directory: its job-name prefix, and its own SLURM log folder (a coordinator that ends removes the
    empty folders of the shared default one, where another run's pending jobs are about to write)."""
    folder = results_dir if Path(results_dir).is_absolute() else Path(workdir) / results_dir
    return ["--slurm-jobname-prefix", run, "--slurm-logdir", str(Path(os.path.realpath(folder)) / "logs" / "slurm")]


def _same_dir(job: dict, workdir: Path) -> bool:
    return os.path.realpath(job.get("WorkDir", "")) == os.path.realpath(workdir)


def belongs(job: dict, run: str, workdir: Path) -> bool:
    """A job of run ``run`` (a ``run_prefix``) in ``workdir``."""
    return _same_dir(job, workdir) and job.get("JobName", "").startswith(run + "_")


def unattributed(job: dict, prefix: str, workdir: Path) -> bool:
    """A job in ``workdir`` named with the bare profile prefix: of some run started without its run prefix."""
    return _same_dir(job, workdir) and re.fullmatch(re.escape(prefix or "plexgpu") + r"_[0-9a-f-]{36}",
                                                     job.get("JobName", "")) is not None


SUBMIT_SETTLE_S = 3        # after telling a coordinator to stop: an sbatch it had begun completes (< 1 s here)
COORDINATOR_EXIT_S = 200   # its jobs cancelled, a coordinator exits at its next status check (slurm plugin: <= 180 s)


def workflow_jobs(run: str, workdir: Path) -> list[dict]:
    return [j for j in slurm.squeue_jobs() if belongs(j, run, workdir)]


def unattributed_jobs(prefix: str, workdir: Path) -> list[dict]:
    return [j for j in slurm.squeue_jobs() if unattributed(j, prefix, workdir)]


def stop_coordinators(workdir: Path, configfiles: list[str], echo=print) -> list[int]:
    """Tell this data set's live coordinators on this host to submit no further job and return their PIDs.

    SIGTERM first: Snakemake then schedules nothing new and exits once its running jobs have ended (which
    ``cancel`` makes happen); it is the one signal a coordinator always honours. Then SIGINT (as Ctrl-C),
    which makes an interactive coordinator scancel its jobs and exit at once; a coordinator started in the
    background (``&``, nohup, a batch script) inherits SIGINT ignored and Python keeps it so, which is why
    SIGINT alone left such a coordinator running (CI: refused after 2 min)."""
    import signal

    live = live_coordinators(workdir, configfiles)
    for pid, cmd in live:
        echo(f"stopping this data set's coordinator first: PID {pid} ({cmd[:100]}): it submits no further job")
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
    return [pid for pid, _ in live]


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until the processes ``pids`` have exited; those still alive after ``timeout`` s."""
    deadline = time.time() + timeout
    alive = list(pids)
    while alive:
        alive = [pid for pid in alive if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
        if not alive or time.time() >= deadline:
            break
        time.sleep(0.5)
    return alive


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def cancel_data_set(run: str, workdir: Path, configfiles: list[str], echo=print) -> tuple[list[dict], list[int]]:
    """Stop data set ``run``: its live coordinators told to submit nothing more (``stop_coordinators``), its
    jobs scancelled, the coordinators waited for (each exits when it next looks at SLURM: the slurm plugin
    looks every 40 s to 3 min), then anything submitted as the signal came scancelled too. Returns the jobs
    cancelled and the coordinators still alive after COORDINATOR_EXIT_S (they submit nothing further)."""
    coordinators = stop_coordinators(workdir, configfiles, echo)
    if coordinators:
        time.sleep(SUBMIT_SETTLE_S)          # an sbatch a coordinator had begun as it was told ends first
    jobs = cancel(run, workdir)
    alive = wait_gone(coordinators, COORDINATOR_EXIT_S)
    return jobs + cancel(run, workdir), alive


def cancel(run: str, workdir: Path, timeout: float = 120) -> list[dict]:
    """scancel the jobs of run ``run`` (a ``run_prefix``) and wait until squeue shows none of them."""
    jobs = workflow_jobs(run, workdir)
    slurm.scancel([j["JobID"] for j in jobs])
    deadline = time.time() + timeout
    while workflow_jobs(run, workdir):
        if time.time() > deadline:
            raise slurm.SlurmError(f"jobs of this workflow still in squeue after {timeout:.0f} s")
        time.sleep(1)
    return jobs


def incomplete_outputs(workdir: Path) -> set[str]:
    """Outputs Snakemake marked incomplete (a job that started and never finished)."""
    folder = workdir / ".snakemake" / "incomplete"
    out = set()
    if folder.is_dir():
        for marker in folder.iterdir():
            try:
                path = base64.urlsafe_b64decode(marker.name.encode()).decode()
            except Exception:
                continue
            out.add(os.path.realpath(workdir / path))
    return out


@dataclass
class StageState:
    cycle: str
    stage: str
    state: str            # done | running | failed | incomplete | damaged | not started
    detail: str = ""


def status(results_dir: Path, workdir: Path, cycles: list[str], channels: list[int], run: str) -> list[StageState]:
    """Per cycle and stage, then registration (cycle "all"): where run ``run`` stands."""
    results_dir = results_dir if results_dir.is_absolute() else workdir / results_dir
    running = {}
    history: dict[tuple[str, str], dict] = {}
    if slurm.available():
        for j in workflow_jobs(run, workdir):
            for key in slurm.job_stages(j["Comment"]):    # a cycle's group job: each of its stages
                running[key] = j
        for r in slurm.sacct_jobs(start="now-7days"):
            if belongs(r, run, workdir):
                for key in slurm.job_stages(r["Comment"]):
                    if key not in history or int(r["JobID"]) > int(history[key]["JobID"]):
                        history[key] = r
    incomplete = incomplete_outputs(workdir)
    out = []
    items = [(cycle, st.name, (st.name, cycle), paths.stage_files(results_dir, st.name, cycle, channels))
             for cycle in cycles for st in paths.PIPELINE if st.per_cycle]
    items += [("all", st.name, (st.name, ""), paths.stage_files(results_dir, st.name, "", channels))
              for st in paths.PIPELINE if not st.per_cycle]
    for cycle, stage, key, files in items:
        partial = any(os.path.realpath(f) in incomplete for f in files)
        complete = all(f.exists() for f in files)
        broken = first_damaged(files) if complete else None
        if key in running and (partial or not complete):
            j = running[key]        # (a stage its group job has finished already is done)
            out.append(StageState(cycle, stage, "running", f"job {j['JobID']}, account {j['Account']}, {j['State']}"))
        elif partial:
            out.append(StageState(cycle, stage, "incomplete", "started, never finished (partial outputs)"))
        elif broken:
            out.append(StageState(cycle, stage, "damaged", broken))
        elif complete:
            out.append(StageState(cycle, stage, "done"))
        elif key in history and history[key]["State"].split()[0] in slurm.FAILED_STATES:
            h = history[key]
            out.append(StageState(cycle, stage, "failed", f"{h['State'].split()[0]} (job {h['JobID']}, "
                                                           f"account {h['Account']})"))
        else:
            out.append(StageState(cycle, stage, "not started"))
    return out


def fed_stages_done(states: list[StageState]) -> set[tuple[str, str]]:
    """(cycle, stage) of the stages not done that Snakemake will not run: a stage runs only where its
    outputs are missing and a stage that reads it runs (the later stages of its cycle; the last one's
    reader, the stages over all cycles), the last one where it is not done. Deleted intermediates under
    finished stages are these (rerun said it would rebuild them, then nothing ran)."""
    state = {(s.cycle, s.stage): s.state for s in states}
    order = [st.name for st in paths.PIPELINE]
    runs: dict[tuple[str, str], bool] = {}

    def will_run(cycle: str, stage: str) -> bool:
        key = (cycle, stage)
        if key not in runs:
            after = order[order.index(stage) + 1:]
            # what reads it: the later stages of its cycle; the last one's, the stages over all cycles
            later = [(cycle, n) for n in after if paths.stage(n).per_cycle] if cycle != "all" else []
            later = [k for k in later if k in state] or [("all", n) for n in after if not paths.stage(n).per_cycle
                                                         and ("all", n) in state]
            runs[key] = state[key] != "done" and (not later or any(will_run(*k) for k in later))
        return runs[key]
    return {k for k, v in state.items() if v not in ("done", "running") and not will_run(*k)}


def _configfiles(args: list[str], cwd: str) -> set[str]:
    """The resolved --configfile values of a snakemake command line (several may follow the flag)."""
    out, taking = set(), False
    for a in args[1:]:
        if a in ("--configfile", "--configfiles"):
            taking = True
        elif a.startswith("-"):
            taking = False
        elif taking:
            out.add(os.path.realpath(os.path.join(cwd, a)))
    return out


def live_coordinators(workdir: Path, configfiles: list[str] | None = None) -> list[tuple[int, str]]:
    """Snakemake coordinators (not remote job processes) running in ``workdir`` on this host; with
    ``configfiles``, only those of the same data set (same config files; one that names none counts)."""
    found = []
    me = os.getpid()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == me:
            continue
        try:
            cmd = (pid_dir / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(pid_dir / "cwd")
        except OSError:
            continue
        text = " ".join(c.decode(errors="replace") for c in cmd)
        if "snakemake" not in text or "--target-jobs" in text or "--mode remote" in text or "slurm-jobstep" in text:
            continue
        if not any(Path(c.decode(errors="replace")).name in ("snakemake", "__main__.py") or c == b"snakemake"
                   for c in cmd) and "-m snakemake" not in text:
            continue
        workflow_dir = cwd
        args = [c.decode(errors="replace") for c in cmd]
        for flag in ("-d", "--directory"):
            if flag in args and args.index(flag) + 1 < len(args):
                workflow_dir = args[args.index(flag) + 1]
        if os.path.realpath(workflow_dir) != os.path.realpath(workdir):
            continue
        theirs = _configfiles(args, cwd)
        if configfiles and theirs and theirs != {os.path.realpath(c) for c in configfiles}:
            continue                                     # another data set from the same checkout
        found.append((int(pid_dir.name), text))
    return found


def snakemake_args(configfiles: list[str], workdir: Path, snakefile: Path | None = None) -> list[str]:
    return ["--configfile", *configfiles, "-s", str(snakefile or REPO_ROOT / "Snakefile"), "-d", str(workdir)]


def rerun(configfiles: list[str], target: str, workdir: Path, profile: Path, jobs: int, results_dir: Path,
          cycles: list[str], channels: list[int], extra: list[str], echo=print) -> int:
    prefix = profile_prefix(profile)
    run = profile_run(profile, results_dir, workdir)
    live = live_coordinators(workdir, configfiles)
    if live:
        pid, cmd = live[0]
        echo(f"plexgpu rerun: refused: a live snakemake coordinator runs this data set: PID {pid} on host "
             f"{socket.gethostname()} ({cmd[:120]}); stop it (Ctrl-C) or let it finish first")
        return 3
    loose = unattributed_jobs(prefix, workdir) if slurm.available() else []
    if loose:
        echo(f"plexgpu rerun: refused: job(s) {', '.join(j['JobID'] for j in loose)} in squeue were started from "
             f"{workdir} without a run prefix (named {prefix}_<uuid>), so plexgpu cannot tell which data set they "
             f"belong to and they could race the rerun; if they are this run's: "
             f"scancel {' '.join(j['JobID'] for j in loose)}")
        return 3
    before = status(results_dir, workdir, cycles, channels, run)
    stale = cancel(run, workdir) if slurm.available() else []
    for j in stale:
        echo(f"cancelled stale job {j['JobID']} ({slurm.parse_comment(j['Comment'])[0]} "
             f"{slurm.parse_comment(j['Comment'])[1]}, account {j['Account']})")
    stale_locks = remove_stale_locks(workdir, results_dir)     # this data set's only: not snakemake --unlock,
    if stale_locks:                                            # which removes every live run's lock too
        echo(f"removed the stale lock of this data set's killed coordinator ({len(stale_locks)} lock file(s) in "
             f"{lock_folder(workdir)}; other data sets' locks kept)")
    todo = [s for s in before if s.state != "done"]
    for s in todo:
        if s.state == "damaged":       # plexgpu's own output, unusable: removed, so that Snakemake remakes it
            for f in paths.stage_files(results_dir, s.stage, "" if s.cycle == "all" else s.cycle, channels):
                if damaged(f):
                    f.unlink()
                    echo(f"removed damaged {f}: its stage reruns")
    fed = fed_stages_done(before)
    for s in todo:
        if (s.cycle, s.stage) in fed:
            echo(f"not rerun {s.cycle} {s.stage}: {s.state}, but every stage it feeds is done (its outputs were "
                 f"removed); to remake them: snakemake {target} --forcerun {s.stage} ...")
            continue
        why = s.detail or s.state
        if s.state == "running":
            why = f"its job was stale and is cancelled ({s.detail})"
        echo(f"rerun {s.cycle} {s.stage}: {s.state}" + (f" - {why}" if why != s.state else ""))
    if not todo:
        echo("every cycle's stages are done; snakemake decides what else is left")
    cmd = [sys.executable, "-m", "snakemake", target, *snakemake_args(configfiles, workdir), "--profile",
           str(profile), *run_options(run, results_dir, workdir), "-j", str(jobs), "--rerun-incomplete", *extra]
    echo("running: " + " ".join(cmd[2:]))
    return subprocess.run(cmd).returncode


def next_steps(results_dir: Path, cycles: list[str], channels: list[int], configfiles: list[str]) -> str:
    """What a failed run's end says: the cycles x stages not done (from the files, so it works without
    SLURM too), under each the one-line error of the stage that failed or was cut short (its job record;
    the SLURM profile does not print whole job logs, a cancelled group job's twice), and the exact
    commands that show why and rerun only those."""
    from ..qc_state import stage_states

    results_dir = Path(results_dir)
    states = stage_states(results_dir, cycles, channels)
    missing: dict[str, list[str]] = {}
    why: dict[str, list[str]] = {}
    for st in paths.PIPELINE:
        for cycle in cycles if st.per_cycle else ["all cycles"]:
            if all(f.exists() for f in paths.stage_files(results_dir, st.name, cycle, channels)):
                continue
            missing.setdefault(cycle, []).append(st.name)
            mine = [states.get((st.name, c)) for c in (cycles if cycle == "all cycles" else [cycle])]
            mine = [m for m in mine if m and (m.status == "fail" or m.reason.startswith("started"))]
            if mine:
                line = f"{st.name} {'failed' if mine[0].status == 'fail' else 'cut short'}: {mine[0].reason}"
                why.setdefault(cycle, []).append(line + (f" (log: {mine[0].log})" if mine[0].log else ""))
    cfg = " ".join(str(c) for c in configfiles) or "config.yaml"
    lines = [f"plexgpu: the run stopped with {sum(len(v) for v in missing.values())} stage(s) not done:"]
    for cycle, stages in missing.items():
        lines.append(f"  {cycle}: {', '.join(stages)}")
        lines += [f"    {w}" for w in why.get(cycle, [])]
    lines += [f"why, per cycle and stage (job state, account): plexgpu status --configfile {cfg}",
              f"rerun only what is unfinished:               plexgpu rerun registration --configfile {cfg}",
              f"each job's log: {results_dir}/logs/<rule>/<cycle>.log"]
    return "\n".join(lines)
