"""The output layout (the README's tables), relative to ``results_dir``: one place for the workflow's
rules (rules/common.smk) and the CLI (``plexgpu status``) alike."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STITCHED = "stitched/{cycle}/CH{ch}.ome.tif"
PROFILES = "basic/{cycle}/CH{ch}.profiles.tif"
POSITIONS = "stitched/{cycle}/positions.csv"
PAIRS = "stitched/{cycle}/pairs.csv"
PLANES = "stitched/{cycle}/planes.json"
DECONVOLVED = "deconvolved/{cycle}/CH{ch}.ome.tif"
EDF = "edf/{cycle}/CH{ch}.ome.tif"                          # of the stitched stack: for quantification
EDF_DECONVOLVED = "edf/{cycle}/CH{ch}.deconvolved.ome.tif"  # of the deconvolved stack: display, segmentation
FOCUS = "edf/{cycle}/CH{ch}.focus.tif"
REGISTERED = "registered/{cycle}/CH{ch}.ome.tif"
REGISTERED_DECONVOLVED = "registered/{cycle}/CH{ch}.deconvolved.ome.tif"
SHIFTS = "registered/shifts.csv"
PLEX = "registered/plex.ome.tif"                            # measure per-cell intensities here
PLEX_DECONVOLVED = "registered/plex_deconvolved.ome.tif"    # view and segment here
MARKERS = "registered/markers.csv"                          # MCMICRO: channel_number,cycle_number,marker_name
ACCOUNTING = "accounting/jobs"
QC_INDEX = "qc/index.html"

#: the files that prove registration (over all cycles) is done
REGISTRATION_FILES = (SHIFTS, PLEX, PLEX_DECONVOLVED, MARKERS)


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline: its rule's name, the files that prove it done, whether it runs
    once per cycle (else once over all cycles) and on a GPU."""

    name: str
    outputs: tuple[str, ...]
    per_cycle: bool = True
    gpu: bool = True


#: THE stage registry, in pipeline order: paths, status and rerun, the simulator, the QC page and
#: (through each rule's ``gpu_stage`` resource, rules/common.smk) the gpu-only scheduler all read it
PIPELINE = (
    Stage("stitch", (STITCHED, PROFILES, POSITIONS, PAIRS, PLANES)),
    Stage("deconvolve", (DECONVOLVED,)),
    Stage("edf", (EDF, EDF_DECONVOLVED, FOCUS)),
    Stage("registration", REGISTRATION_FILES, per_cycle=False),
)


def cycle_stages() -> tuple[str, ...]:
    return tuple(s.name for s in PIPELINE if s.per_cycle)


def stage(name: str) -> Stage:
    return next(s for s in PIPELINE if s.name == name)


def gpu_stage_rank(name: str) -> int:
    """1-based position of a GPU stage in the pipeline (0: not a GPU stage): the ``gpu_stage``
    resource each rule declares, from which the gpu-only scheduler knows GPU work and its order."""
    names = [s.name for s in PIPELINE if s.gpu]
    return names.index(name) + 1 if name in names else 0


def stage_files(results_dir: str | Path, stage_name: str, cycle: str, channels: list[int]) -> list[Path]:
    out = []
    for pattern in stage(stage_name).outputs:
        if "{ch}" in pattern:
            out += [Path(results_dir) / pattern.format(cycle=cycle, ch=ch) for ch in channels]
        else:
            out.append(Path(results_dir) / pattern.format(cycle=cycle))
    return out

