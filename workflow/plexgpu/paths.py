"""The output layout of design §4, relative to ``results_dir``: one place for the workflow's
rules (rules/common.smk) and the CLI (``plexgpu status``) alike."""

from __future__ import annotations

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

#: per-cycle GPU stages and the files that prove each is done
STAGE_OUTPUTS = {
    "stitch": (STITCHED, PROFILES, POSITIONS, PAIRS, PLANES),
    "deconvolve": (DECONVOLVED,),
    "edf": (EDF, EDF_DECONVOLVED, FOCUS),
}


def stage_files(results_dir: str | Path, stage: str, cycle: str, channels: list[int]) -> list[Path]:
    out = []
    for pattern in STAGE_OUTPUTS[stage]:
        if "{ch}" in pattern:
            out += [Path(results_dir) / pattern.format(cycle=cycle, ch=ch) for ch in channels]
        else:
            out.append(Path(results_dir) / pattern.format(cycle=cycle))
    return out

