"""The stage registry and the output layout (the README's tables), relative to ``results_dir``.

Each stage is declared once, here: its rule's name, its named outputs (the rule takes them with
``output: **stage_outputs(name)``, rules/common.smk, and the script hands ``snakemake.output``
straight to the stage function, which reads the same names), whether it runs per cycle and on a
GPU, and its reference minutes for ``plexgpu plan --simulate``. The rules, status / rerun /
next_steps, the simulator, the QC page, the report and the gpu-only scheduler (through each rule's
``gpu_stage`` resource) all read it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ACCOUNTING = "accounting/jobs"
QC_INDEX = "qc/index.html"
RUN_MANIFEST = ".plexgpu/run-manifest.pickle"  # what the coordinator resolved, read by the jobs
COORDINATOR = ".plexgpu/coordinator.json"      # the live coordinator running this data set's GPU jobs


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline.

    ``outputs``: (name, pattern) pairs, in the rule's order; ``{cycle}`` and ``{ch}`` are the cycle
    key and channel number (a per-cycle stage keeps ``{cycle}`` as its rule's wildcard; a stage over
    all cycles has one file per cycle where the pattern names it). ``minutes``: (GPU, CPU) minutes
    of one job at the reference size, what ``plexgpu plan --simulate`` assumes unless told."""

    name: str
    outputs: tuple[tuple[str, str], ...]
    per_cycle: bool = True
    gpu: bool = True
    minutes: tuple[float, float] = (1.0, 1.0)
    colour: str = "#888888"                   # its colour in the report's timeline

    def output(self, name: str) -> str:
        return dict(self.outputs)[name]


#: THE stage registry, in pipeline order
PIPELINE: tuple[Stage, ...] = (
    Stage("stitch", (("stitched", "stitched/{cycle}/CH{ch}.ome.tif"),        # ZYX uint16, flat/dark corrected
                     ("profiles", "basic/{cycle}/CH{ch}.profiles.tif"),
                     ("defects", "basic/{cycle}/defects.csv"),                 # the sensor's hot/stuck pixels
                     ("positions", "stitched/{cycle}/positions.csv"),
                     ("pairs", "stitched/{cycle}/pairs.csv"),
                     ("planes", "stitched/{cycle}/planes.json")),
          minutes=(8.0, 200.0), colour="#4c78a8"),
    Stage("deconvolve", (("deconvolved", "deconvolved/{cycle}/CH{ch}.ome.tif"),
                         ("flux", "deconvolved/{cycle}/flux.json")),               # RL's flux per channel
          minutes=(12.0, 60.0), colour="#f58518"),
    Stage("edf", (("edf", "edf/{cycle}/CH{ch}.ome.tif"),                     # of the stitched stack: quantification
                  ("edf_deconvolved", "edf/{cycle}/CH{ch}.deconvolved.ome.tif"),  # display, segmentation
                  ("focus", "edf/{cycle}/CH{ch}.focus.tif")),
          minutes=(1.5, 22.0), colour="#54a24b"),
    Stage("registration", (("registered", "registered/{cycle}/CH{ch}.ome.tif"),
                           ("registered_deconvolved", "registered/{cycle}/CH{ch}.deconvolved.ome.tif"),
                           ("shifts", "registered/shifts.csv"),
                           ("transforms", "registered/transforms.json"),         # rigid + local field per cycle
                           ("camera", "registered/camera.json"),     # each channel's camera offset, per cycle's change
                           ("plex", "registered/plex.ome.tif"),                # measure per-cell intensities here
                           ("plex_deconvolved", "registered/plex_deconvolved.ome.tif"),  # view and segment here
                           ("markers", "registered/markers.csv")),             # MCMICRO's columns
          per_cycle=False, minutes=(0.0, 0.0), colour="#b279a2"),
)


def log_file(rule: str, cycle: str = "") -> str:
    """A rule's log, relative to results_dir: ``logs/<rule>/<cycle>.log`` (``<rule>.log`` for a rule over
    all cycles); ``cycle`` may be the ``{cycle}`` wildcard."""
    return f"logs/{rule}/{cycle or rule}.log"


def stage(name: str) -> Stage:
    for s in PIPELINE:
        if s.name == name:
            return s
    raise KeyError(f"no stage {name!r} in the registry (paths.PIPELINE): {', '.join(s.name for s in PIPELINE)}")


def cycle_stages() -> tuple[str, ...]:
    return tuple(s.name for s in PIPELINE if s.per_cycle)


def gpu_stage_rank(name: str) -> int:
    """1-based position of a GPU stage in the pipeline (0: not a GPU stage): the ``gpu_stage``
    resource each rule declares, from which the gpu-only scheduler knows GPU work and its order."""
    names = [s.name for s in PIPELINE if s.gpu]
    return names.index(name) + 1 if name in names else 0


def output_pattern(stage_name: str, output: str) -> str:
    """The pattern of one named output, relative to results_dir (e.g. ``("stitch", "planes")``)."""
    return stage(stage_name).output(output)


def outputs(stage_name: str, results_dir: str | Path, channels, cycle: str = "{cycle}", cycles=()) -> dict:
    """A stage's named outputs: {name: path, or list of paths}. ``{ch}`` is expanded over ``channels``
    (a list, in channel order); a per-cycle stage's ``{cycle}`` becomes ``cycle`` (by default kept
    as the rule's wildcard); a stage over all cycles has one file per cycle of ``cycles`` where its
    pattern names a cycle (cycle-major, channel-minor). The rule declares exactly these
    (``output: **stage_outputs(name)``) and its script hands them to the stage function."""
    st = stage(stage_name)
    out: dict = {}
    for name, pattern in st.outputs:
        over_cycles = not st.per_cycle and "{cycle}" in pattern
        files = [f"{results_dir}/{pattern}".format(cycle=c, ch=ch)
                 for c in (cycles if over_cycles else [cycle]) for ch in (channels if "{ch}" in pattern else [None])]
        out[name] = files if (over_cycles or "{ch}" in pattern) else files[0]
    return out


def stage_files(results_dir: str | Path, stage_name: str, cycle: str, channels, cycles=()) -> list[Path]:
    """The files that prove a stage done: a per-cycle stage's of ``cycle``; a stage over all cycles'
    of every cycle in ``cycles`` (without ``cycles``: only its files that name no cycle)."""
    return [Path(f) for v in outputs(stage_name, results_dir, channels, cycle, cycles).values()
            for f in ([v] if isinstance(v, str) else v)]
