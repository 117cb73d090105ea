"""Instrument metadata beside the cycle folders: Akoya ``experiment.json`` and
``channelNames.txt``. Values are returned in plexgpu's units; config wins over them."""

from __future__ import annotations

import json
from pathlib import Path

from .raw import RawDataError


def _um(value: float) -> float:
    """Akoya writes xyResolution/zPitch in nm (377.4, 1500); small values are already µm."""
    value = float(value)
    return value / 1000.0 if value > 50 else value


def _percent(value) -> float:
    """Akoya writes tileOverlapX in percent (30); values below 1 are already fractions."""
    value = float(value)
    return value / 100.0 if value >= 1 else value


# Akoya key -> (config name, conversion to plexgpu's units)
_EXPERIMENT_KEYS = {
    "numCycles": ("num_cycles", int), "regionHeight": ("rows", int), "regionWidth": ("cols", int),
    "tileOverlapX": ("overlap", _percent), "xyResolution": ("pixel_size_um", _um), "zPitch": ("z_step_um", _um),
    "numZPlanes": ("z_planes", int),
}


def read_experiment_json(raw_dir: str | Path) -> dict:
    """Known Akoya keys of ``experiment.json`` mapped to config names; {} if absent."""
    path = Path(raw_dir) / "experiment.json"
    if not path.is_file():
        return {}
    try:
        exp = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RawDataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(exp, dict):
        raise RawDataError(f"{path}: expected a JSON object of experiment settings, got {type(exp).__name__}")
    out: dict = {}
    for key, (name, convert) in _EXPERIMENT_KEYS.items():
        if key in exp:
            try:
                out[name] = convert(exp[key])
            except (TypeError, ValueError):
                raise RawDataError(f"{path}: {key} = {exp[key]!r} is not a number") from None
    names = exp.get("channelNames")
    if isinstance(names, dict):
        names = names.get("channelNamesArray")
    if isinstance(names, list) and names:
        out["markers"] = [str(n) for n in names]
    return out


def read_marker_file(path: str | Path) -> list[str]:
    """One marker per line (cycle-major), blank lines ignored."""
    path = Path(path)
    if not path.is_file():
        raise RawDataError(f"markers file {path} not found (config key markers_file)")
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]
