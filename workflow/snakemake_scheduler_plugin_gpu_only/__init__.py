"""Snakemake scheduler plugin ``gpu-only`` (``snakemake --scheduler gpu-only``) for plexgpu.

* Each GPU account runs at most its ``gpu_slots`` GPU jobs at once. A rule says its account
  (``slurm_account``) and holds that account's slot token (``gpu_<account>`` = 1, see
  :func:`slot_token`); plexgpu's Snakefile makes each token a global resource of the account's
  ``gpu_slots``, so a plain ``snakemake registration --configfile config.yaml --profile profiles/slurm``
  needs no hand-written ``--resources``. Snakemake's core counts the tokens: it frees them when a
  job finishes or fails and counts a group job (a cycle's stages in one allocation) once.
* Every resource the core hands over (``_cores``, ``_nodes``, ``_job_count``, the slot tokens,
  custom ones) is respected: the core subtracts what the selection uses without re-checking.
* GPU work goes before QC; among GPU work, started cycles go before new ones, the
  earliest cycle first, the downstream stage first (finish what was started).
* A GPU-stage job that asks for no GPU, or whose account has no slot resource, is refused with a
  clear error: there is no CPU fallback, and no account runs uncapped.
* Inside remote jobs (started with ``--scheduler gpu-only`` too, one job each) it has
  nothing to decide and does the same checks harmlessly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Union

from snakemake_interface_scheduler_plugins.base import SchedulerBase
from snakemake_interface_scheduler_plugins.interfaces.jobs import JobSchedulerInterface
from snakemake_interface_scheduler_plugins.settings import SchedulerSettingsBase

#: the resource by which a rule says it is a GPU stage: its 1-based rank in the workflow's stage
#: registry, downstream highest (plexgpu's rules/common.smk sets it from paths.PIPELINE)
STAGE = "gpu_stage"
ACCOUNT = "slurm_account"


def slot_token(account: str) -> str:
    """The resource that counts one account's GPU slots: ``gpu_<account>``, non-alphanumerics as ``_``."""
    return "gpu_" + "".join(c if c.isalnum() else "_" for c in account)


class GpuOnlySchedulingError(RuntimeError):
    """A job that would break the GPU-only contract."""


@dataclass
class SchedulerSettings(SchedulerSettingsBase):
    pass


def _single_jobs(job) -> list:
    jobs = getattr(job, "jobs", None)
    return list(jobs()) if callable(jobs) else [job]


def _rule(job) -> str:
    rule = getattr(job, "rule", None)
    return getattr(rule, "name", "") or ""


def _cycle(job) -> str:
    wildcards = getattr(job, "wildcards", None) or {}
    try:
        return str(dict(wildcards).get("cycle", ""))
    except (TypeError, ValueError):
        return ""


def _stage_rank(job) -> int:
    """The ``gpu_stage`` rank a job's rule declares (0: not a GPU stage)."""
    try:
        return int(job.scheduler_resources.get(STAGE, 0) or 0)
    except (AttributeError, TypeError, ValueError):
        return 0


def is_gpu_stage(job) -> bool:
    return any(_stage_rank(j) > 0 for j in _single_jobs(job)) or _stage_rank(job) > 0


def gpu_account(job) -> str | None:
    """The account a GPU job is scheduled on, else None."""
    account = job.scheduler_resources.get(ACCOUNT)
    return str(account) if account else None


def check_gpu_request(job) -> None:
    """A GPU-stage job scheduled on an account must ask for a GPU."""
    res = job.scheduler_resources
    if is_gpu_stage(job) and res.get(ACCOUNT) and int(res.get("gpu", 0) or 0) < 1:
        names = ", ".join(f"{_rule(j)} {_cycle(j)}".strip() for j in _single_jobs(job))
        raise GpuOnlySchedulingError(
            f"gpu-only scheduler: {names} is a GPU stage but asks for no GPU (resources gpu="
            f"{res.get('gpu', 0)}); plexgpu has no CPU fallback: restore `gpu=1` in its rule")


def check_slot_resource(job, available: Mapping[str, Union[int, str]]) -> None:
    """A GPU job's account must be capped: its slot token must be a resource Snakemake counts."""
    account = gpu_account(job)
    if account and is_gpu_stage(job) and slot_token(account) not in available:
        names = ", ".join(f"{_rule(j)} {_cycle(j)}".strip() for j in _single_jobs(job))
        raise GpuOnlySchedulingError(
            f"gpu-only scheduler: {names} runs on account {account}, which has no slot resource "
            f"{slot_token(account)}: give it with --resources {slot_token(account)}=<its gpu_slots>")


class Scheduler(SchedulerBase):
    def __post_init__(self) -> None:
        self.cycle_order: dict[str, int] = {}

    def dag_updated(self) -> None:
        cycles = sorted({_cycle(j) for j in self.dag.needrun_jobs()} - {""})
        self.cycle_order = {c: i for i, c in enumerate(cycles)}

    def _started(self, remaining_jobs) -> set:
        """The cycles that have begun: a job of theirs was submitted (it is no longer remaining)."""
        remaining = set(map(id, remaining_jobs))
        return {_cycle(j) for j in self.dag.needrun_jobs() if id(j) not in remaining}

    def _preference(self, job, started: set) -> tuple:
        singles = _single_jobs(job)
        stage = max([_stage_rank(j) - 1 for j in singles if _stage_rank(j) > 0] + [_stage_rank(job) - 1])
        cycles = [_cycle(j) for j in singles if _cycle(j)]
        order = min((self.cycle_order.get(c, len(self.cycle_order)) for c in cycles), default=-1)
        return (0 if stage >= 0 else 1,                         # GPU work before QC
                0 if not cycles or set(cycles) & started else 1,  # started cycles (and registration) first
                order,                                          # earliest cycle first
                -stage,                                         # downstream stage first
                -int(getattr(job, "priority", 0) or 0))

    def select_jobs(
        self,
        selectable_jobs: Sequence[JobSchedulerInterface],
        remaining_jobs: Sequence[JobSchedulerInterface],
        available_resources: Mapping[str, Union[int, str]],
        input_sizes: Dict,
    ) -> Optional[Sequence[JobSchedulerInterface]]:
        for job in selectable_jobs:
            check_gpu_request(job)
            check_slot_resource(job, available_resources)
        free = {k: v for k, v in available_resources.items() if isinstance(v, int)}
        started = self._started(remaining_jobs)
        selected = []
        for job in sorted(selectable_jobs, key=lambda j: self._preference(j, started)):
            res = job.scheduler_resources
            need = {k: res.get(k, 0) for k in free}
            if any(not isinstance(v, int) or v > free[k] for k, v in need.items()):
                continue  # e.g. this account's GPU slots are all busy: the job waits for one (no CPU fallback)
            for k, v in need.items():
                free[k] -= v
            selected.append(job)
        return selected
