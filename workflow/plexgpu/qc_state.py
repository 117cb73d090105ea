"""Where each stage of each cycle stands, from the files alone, for the QC page: QC reads what exists
and never runs a stage, so a stage that failed or has not run is shown as such instead of being
asked for. Done: every output of the stage is there (each is written whole or not at all). Failed:
the stage's latest job record (accounting/jobs, written also when a job fails) says so, with its
one-line error. Started: its log exists but neither (a cancelled or killed job). Otherwise not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import paths
from .cluster.accounting import load_records
from .io.tiff import first_damaged

#: what the QC of a stage reads: the stages that must be done for it to run
QC_READS = {"stitch": ("stitch",), "deconvolve": ("stitch", "deconvolve"), "edf": ("stitch", "edf"),
            "registration": ("registration",)}


@dataclass(frozen=True)
class StageState:
    status: str           # "done" | "fail" | "not run"
    reason: str = ""      # one line: the job's error, or why it did not run
    log: str = ""         # the stage's log, where one was written

    def verdict(self) -> dict:
        """As a QC verdict cell: status and reasons (the log path last)."""
        return {"status": self.status, "reasons": [r for r in (self.reason, self.log and f"log: {self.log}") if r]}


def is_done(results_dir: str | Path, stage: str, cycle: str, channels, cycles) -> bool:
    """Every output of the stage is there and whole (``io.tiff.damaged``)."""
    files = paths.stage_files(results_dir, stage, cycle, channels, cycles)
    return all(f.is_file() for f in files) and first_damaged(files) is None


def qc_ready(results_dir: str | Path, stage: str, cycle: str, channels, cycles) -> bool:
    """Every stage the QC of ``stage`` reads is done for ``cycle`` (all cycles for registration)."""
    return all(is_done(results_dir, s, cycle, channels, cycles) for s in QC_READS[stage])


def _latest_records(results_dir: Path) -> dict[tuple[str, str], dict]:
    folder = results_dir / paths.ACCOUNTING
    latest: dict[tuple[str, str], dict] = {}
    for r in load_records(folder) if folder.is_dir() else []:
        key = (r.get("rule", ""), r.get("cycle", "") or "")
        if key not in latest or r.get("end", 0) >= latest[key].get("end", 0):
            latest[key] = r
    return latest


def stage_states(results_dir: str | Path, cycles: list[str], channels) -> dict[tuple[str, str], StageState]:
    """{(stage, cycle): StageState} for every per-cycle stage of every cycle and, for a stage over all
    cycles, one entry per cycle: the job's error is that cycle's where it names the cycle, the others
    say the job failed on it."""
    results_dir = Path(results_dir)
    records = _latest_records(results_dir)
    out: dict[tuple[str, str], StageState] = {}
    for st in paths.PIPELINE:
        for cycle in cycles:
            key_cycle = cycle if st.per_cycle else ""
            log = results_dir / paths.log_file(st.name, key_cycle)
            log_s = str(log) if log.is_file() else ""
            files = paths.stage_files(results_dir, st.name, key_cycle or cycle, channels, cycles)
            if all(f.is_file() for f in files):
                broken = first_damaged(files)
                out[st.name, cycle] = (StageState("fail", f"{broken}; plexgpu rerun removes and remakes it", log_s)
                                       if broken else StageState("done"))
                continue
            upstream = [s.name for s in paths.PIPELINE[:paths.PIPELINE.index(st)]
                        if (s.name, cycle) in out and out[s.name, cycle].status != "done"]
            rec = records.get((st.name, key_cycle))
            if rec and rec.get("status") == "failed":
                error = (rec.get("error") or "failed, no error recorded").splitlines()[0]
                named = re.findall(r"\bcyc\d{3}\b", error)
                if st.per_cycle or not named or cycle in named:
                    out[st.name, cycle] = StageState("fail", error, log_s)
                else:
                    out[st.name, cycle] = StageState("not run", f"the {st.name} job failed on {', '.join(named)}",
                                                     log_s)
            elif upstream:
                out[st.name, cycle] = StageState("not run", f"waits for {upstream[0]}")
            elif log_s:
                out[st.name, cycle] = StageState("not run", "started and never finished (cancelled or killed?)",
                                                 log_s)
            else:
                out[st.name, cycle] = StageState("not run", "not run yet")
    return out
