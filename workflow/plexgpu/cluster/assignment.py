"""Cycle -> GPU account assignment.

A queue holds each account ``gpu_slots`` times, in config order; cycle i (0-based,
sorted) goes to ``queue[i % len(queue)]``: round-robin in proportion to slots, overflow
cycles wait in SLURM for their account's next free GPU. Pure and deterministic: the
same cycles and accounts always give the same table, whatever the retry attempt.
There is no CPU mode to fall back to.
"""

from __future__ import annotations

from dataclasses import dataclass


class AssignmentError(ValueError):
    """No account can run GPU jobs, or an account is unknown; names the config key."""


@dataclass(frozen=True)
class Slot:
    account: str
    partition: str | None
    gpu_slots: int


def _slots(accounts: list[dict]) -> list[Slot]:
    out = []
    for a in accounts:
        out += [Slot(a["name"], a.get("partition"), int(a["gpu_slots"]))] * int(a["gpu_slots"])
    if not out:
        raise AssignmentError("config key accounts lists no account with gpu_slots > 0: every image job runs "
                              "on a GPU and there is no CPU fallback; give at least one account GPU slots")
    return out


def build_cycle_assignment(cycles: list[str], accounts: list[dict]) -> dict[str, Slot]:
    """{cycle key: Slot}, round-robin over the slot queue."""
    queue = _slots(accounts)
    return {c: queue[i % len(queue)] for i, c in enumerate(sorted(cycles))}


def registration_slot(accounts: list[dict]) -> Slot:
    """Registration runs on the first account with GPU slots."""
    return _slots(accounts)[0]


def total_slots(accounts: list[dict]) -> int:
    """-j: the number of GPUs the workflow may hold at once."""
    return sum(int(a["gpu_slots"]) for a in accounts)


def check_known_accounts(accounts: list[dict], known: set[str] | None) -> None:
    """Every configured account must be one SLURM knows for this user (when that can be asked)."""
    if known is None:
        return
    unknown = [a["name"] for a in accounts if a["name"] not in known]
    if unknown:
        raise AssignmentError(f"config key accounts: SLURM knows no account {', '.join(unknown)} for this user "
                              f"(your accounts: {', '.join(sorted(known)) or 'none'})")
