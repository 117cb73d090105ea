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


def read_experiment_json(raw_dir: str | Path) -> dict:
    """Known Akoya keys of ``experiment.json`` mapped to config names; {} if absent."""
    path = Path(raw_dir) / "experiment.json"
    if not path.is_file():
        return {}
    try:
        exp = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RawDataError(f"{path}: not valid JSON ({exc})") from None
    out: dict = {}
    if "numCycles" in exp:
        out["num_cycles"] = int(exp["numCycles"])
    if "regionHeight" in exp:
        out["rows"] = int(exp["regionHeight"])
    if "regionWidth" in exp:
        out["cols"] = int(exp["regionWidth"])
    if "tileOverlapX" in exp:
        ov = float(exp["tileOverlapX"])
        out["overlap"] = ov / 100.0 if ov >= 1 else ov
    if "xyResolution" in exp:
        out["pixel_size_um"] = _um(exp["xyResolution"])
    if "zPitch" in exp:
        out["z_step_um"] = _um(exp["zPitch"])
    if "numZPlanes" in exp:
        out["z_planes"] = int(exp["numZPlanes"])
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
