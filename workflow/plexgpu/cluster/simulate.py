"""A discrete-event simulation of a plexgpu run: how long N cycles take on the given GPU
slots (policy ``gpu-only``), or with overflow cycles sent to CPU slots (``cpu-fallback``,
what the reference system did). A cycle is one job (its stages' group, one allocation): a
free slot takes the earliest cycle and runs its stages back to back, like the gpu-only
scheduler. Registration runs once every cycle is done.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .assignment import build_cycle_assignment
from .. import paths


def reference_minutes(kind: str) -> tuple[float, ...]:
    """Minutes of each per-cycle stage at the reference size, from the registry: kind "gpu" or "cpu"."""
    i = {"gpu": 0, "cpu": 1}[kind]
    return tuple(s.minutes[i] for s in paths.PIPELINE if s.per_cycle)


@dataclass
class SimResult:
    policy: str
    makespan_min: float
    waves: int
    busy_min: dict[str, float] = field(default_factory=dict)      # per account / pool
    cycle_done_min: dict[str, float] = field(default_factory=dict)
    jobs: list[tuple] = field(default_factory=list)                # (pool, cycle, stage, start, end)

    def summary(self) -> str:
        h = self.makespan_min / 60
        busy = ", ".join(f"{k} {v:.0f} min" for k, v in self.busy_min.items())
        return (f"{self.policy}: makespan {self.makespan_min:.1f} min ({h:.1f} h), {self.waves} wave(s); "
                f"busy: {busy}")


def _run_pool(cycles: list[str], slots: int, minutes: tuple[float, ...], pool: str, start: float = 0.0):
    """Event simulation of one pool of identical slots. Returns (jobs, done time per cycle)."""
    stages = paths.cycle_stages()                 # the per-cycle chain of the stage registry
    if len(minutes) != len(stages):
        raise ValueError(f"{len(minutes)} stage minutes for the {len(stages)} per-cycle stages {', '.join(stages)}")
    free = [(start, i) for i in range(slots)]  # (time slot becomes free, slot id)
    heapq.heapify(free)
    jobs, done = [], {}
    for c in cycles:                              # the earliest cycle takes the first free slot
        t, slot = heapq.heappop(free)
        for stage, m in zip(stages, minutes):     # one allocation: the cycle's stages back to back
            jobs.append((pool, c, stage, t, t + m))
            t += m
        done[c] = t
        heapq.heappush(free, (t, slot))
    return jobs, done


def simulate(n_cycles: int, accounts: list[dict], gpu_minutes=None, policy: str = "gpu-only",
             cpu_minutes=None, cpu_slots: int = 1, registration_min: float = 0.0) -> SimResult:
    """``gpu_minutes`` / ``cpu_minutes``: one per per-cycle stage (default: the registry's reference minutes)."""
    gpu_minutes = reference_minutes("gpu") if gpu_minutes is None else gpu_minutes
    cpu_minutes = reference_minutes("cpu") if cpu_minutes is None else cpu_minutes
    cycles = [f"cyc{c:03d}" for c in range(1, n_cycles + 1)]
    assignment = build_cycle_assignment(cycles, accounts)
    total = sum(int(a["gpu_slots"]) for a in accounts)
    if policy == "gpu-only":
        gpu_cycles, cpu_cycles = cycles, []
    elif policy == "cpu-fallback":
        gpu_cycles, cpu_cycles = cycles[:total], cycles[total:]
    else:
        raise ValueError(f"--policy must be gpu-only or cpu-fallback, not {policy!r}")
    jobs, done = [], {}
    for a in accounts:
        mine = [c for c in gpu_cycles if assignment[c].account == a["name"]]
        if mine and a["gpu_slots"] > 0:
            j, d = _run_pool(mine, int(a["gpu_slots"]), tuple(gpu_minutes), a["name"])
            jobs += j
            done.update(d)
    if cpu_cycles:
        j, d = _run_pool(cpu_cycles, cpu_slots, tuple(cpu_minutes), "cpu")
        jobs += j
        done.update(d)
    end = max(done.values()) + registration_min
    busy: dict[str, float] = {}
    for pool, _, _, s, e in jobs:
        busy[pool] = busy.get(pool, 0.0) + (e - s)
    waves = -(-len(gpu_cycles) // total)
    return SimResult(policy, end, waves, busy, done, sorted(jobs, key=lambda j: (j[3], j[0])))
