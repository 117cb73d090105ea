"""Each GPU rule's resource request checked against the cluster before any job is submitted:
what sbatch would refuse, or leave pending for ever, said by ``plexgpu plan`` and ``validate`` (which
then exit 3: a run started anyway would sit with its first jobs refused or pending for ever)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from ..paths import PIPELINE
from . import slurm


@dataclass(frozen=True)
class RequestProblem:
    text: str
    refused: bool        # sbatch refuses the job, or it can never start: an error, not a warning


def request_refusals(config: dict) -> tuple[list[str], list[str]]:
    """(what SLURM refuses or never starts, what is only a warning): ``request_problems`` split."""
    problems = request_problems(config)
    return [p.text for p in problems if p.refused], [p.text for p in problems if not p.refused]


def request_problems(config: dict) -> list[RequestProblem]:
    """What sbatch would refuse or leave pending for ever, said before any job: each GPU rule's
    cpus_per_task, mem_mb and runtime against the largest node of each account's partition (sinfo),
    one GPU per job; a cycle's job (its stages in one allocation: the sum of their runtimes) against
    the partition's time limit; and compute.device = gpu where CuPy does not import here."""
    out = []
    for a in config["accounts"]:
        part = a.get("partition")
        lim = slurm.partition_limits(part) if part else None
        if lim is None:
            continue
        for rule in (s.name for s in PIPELINE if s.gpu):
            r = config["resources"][rule]
            for key, have, unit in (("cpus_per_task", lim["cpus"], ""), ("mem_mb", lim["mem_mb"], " MB")):
                if r[key] > have:
                    out.append(RequestProblem(f"resources.{rule}.{key} = {r[key]} but the largest node of partition "
                                              f"{part} has {have}{unit}: sbatch refuses the job", True))
            if lim["time_min"] is not None and r["runtime"] > lim["time_min"]:
                out.append(RequestProblem(f"resources.{rule}.runtime = {r['runtime']} min exceeds partition {part}'s "
                                          f"time limit ({lim['time_min']:.0f} min): refused or pending for ever", True))
        cycle = [s.name for s in PIPELINE if s.gpu and s.per_cycle]
        total = sum(config["resources"][rule]["runtime"] for rule in cycle)
        if lim["time_min"] is not None and total > lim["time_min"]:
            out.append(RequestProblem(
                f"a cycle's job runs {' + '.join(cycle)} in one allocation and asks for the sum of their runtimes, "
                f"{' + '.join(str(config['resources'][r]['runtime']) for r in cycle)} = {total} min, beyond "
                f"partition {part}'s time limit ({lim['time_min']:.0f} min): sbatch refuses it; lower "
                "resources.<stage>.runtime to what the stages take (plexgpu report's card)", True))
        if lim["gpus"] < 1:
            out.append(RequestProblem(f"partition {part} (account {a['name']}) has no node with a GPU: every image "
                                      "job asks for one", True))
    if config["compute"]["device"] == "gpu" and importlib.util.find_spec("cupy") is None:
        out.append(RequestProblem("compute.device = gpu but CuPy does not import here: the GPU jobs import it where "
                                  "they run; install plexgpu[gpu] (cupy-cuda12x) in the environment the jobs use",
                                  False))
    return list(dict.fromkeys(out))          # once each: accounts that share a partition say the same
