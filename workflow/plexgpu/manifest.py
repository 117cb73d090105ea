"""The run manifest: what the coordinator resolved once per run, read by every SLURM job instead.

Each SLURM job parses the Snakefile twice (its batch step, then its ``srun`` step), and a parse used
to resolve the whole experiment again (every cycle's folder listed and checked, the schema read)
and, with ``gpu_slots: auto``, to ask ``sacctmgr`` — seconds of an allocated GPU per job, growing
with the number of cycles. The coordinator writes what it resolved (the Experiment and the accounts
with their slots) to ``<results>/.plexgpu/run-manifest.pickle`` when the run starts; a job's parse
reads it when its key still matches: the validated config and the modification times of the raw
folder and of everything directly in it (a tile added or removed changes its cycle folder's mtime,
a rewritten experiment.json or marker file its own). A job whose key does not match resolves as
before. Raw data are never modified, so what a job reads of its own cycle is what the coordinator
proved complete; the stage still fails loudly on a tile it cannot read.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

from . import paths
from .experiment import Experiment, resolve_experiment
from .io.tiff import atomic_path

@dataclass
class Manifest:
    key: str
    experiment: Experiment
    accounts: list[dict]


def manifest_path(config: dict) -> Path:
    return Path(config["results_dir"]) / paths.RUN_MANIFEST


def run_key(config: dict) -> str:
    """What the resolved experiment depends on: the validated config (``gpu_slots: auto`` as given)
    and the mtimes of the raw folder and of each entry in it."""
    raw = Path(config["raw_dir"])
    stamps = []
    try:
        stamps.append(("", raw.stat().st_mtime_ns))
        with os.scandir(raw) as entries:
            stamps += sorted((e.name, e.stat().st_mtime_ns) for e in entries)
    except OSError:
        stamps.append(("unreadable", 0))
    text = json.dumps([config, stamps], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def read_manifest(config: dict, key: str) -> Manifest | None:
    """The coordinator's manifest if it is for this key (config and raw folder), else None."""
    try:
        with open(manifest_path(config), "rb") as fh:
            found = pickle.load(fh)
    except Exception:                       # absent, half a file of another version, unreadable
        return None
    return found if isinstance(found, Manifest) and found.key == key else None


def write_manifest(config: dict, key: str, experiment: Experiment) -> Path:
    path = manifest_path(config)
    with atomic_path(path) as tmp:
        tmp.write_bytes(pickle.dumps(Manifest(key, experiment, copy.deepcopy(config.get("accounts", [])))))
    return path


def resolve_run(config: dict, coordinator: bool) -> tuple[Experiment, str]:
    """The run's Experiment, with ``gpu_slots: auto`` resolved in ``config``, and the run key.

    A job (not the coordinator) takes both from the manifest where it matches; otherwise, and always
    in the coordinator, they are resolved here (SLURM asked for ``auto`` slots, the raw data read)."""
    from .cluster.slurm import resolve_auto_slots

    key = run_key(config)
    if not coordinator:
        found = read_manifest(config, key)
        if found is not None:
            config["accounts"] = found.accounts
            return found.experiment, key
    resolve_auto_slots(config)
    return resolve_experiment(config), key
