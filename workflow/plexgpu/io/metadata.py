"""Instrument metadata beside the cycle folders: Akoya ``experiment.json`` and
``channelNames.txt``. Values are returned in plexgpu's units; config wins over them."""

from __future__ import annotations

import json
import math
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


# Akoya key -> (name, conversion to plexgpu's units, the config key it fills: the schema's rules apply)
_EXPERIMENT_KEYS = {
    "numCycles": ("num_cycles", int, "cycles"), "regionHeight": ("rows", int, "grid.rows"),
    "regionWidth": ("cols", int, "grid.cols"), "tileOverlapX": ("overlap", _percent, "grid.overlap"),
    "xyResolution": ("pixel_size_um", _um, "optics.pixel_size_um"), "zPitch": ("z_step_um", _um, "optics.z_step_um"),
    "numZPlanes": ("z_planes", int, "grid.z_planes"),
}


def _schema_rule(config_key: str) -> dict:
    """The schema's rule for a config key (for ``cycles``: that of one cycle number)."""
    from ..config import schema

    node = schema()
    for part in config_key.split("."):
        node = node["properties"][part]
    return node.get("items", node) if config_key == "cycles" else node


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
    import jsonschema

    out: dict = {}
    for key, (name, convert, config_key) in _EXPERIMENT_KEYS.items():
        if key in exp:
            if isinstance(exp[key], bool):
                raise RawDataError(f"{path}: {key} = {exp[key]!r} is not a number")
            try:
                out[name] = convert(exp[key])
            except (TypeError, ValueError, OverflowError):
                raise RawDataError(f"{path}: {key} = {exp[key]!r} is not a number") from None
            if not math.isfinite(out[name]):             # json reads NaN and Infinity; no limit catches them
                raise RawDataError(f"{path}: {key} = {exp[key]!r} is not a finite number")
            try:                                      # the limits of the config key it fills
                jsonschema.validate(out[name], _schema_rule(config_key))
            except jsonschema.ValidationError as err:
                raise RawDataError(f"{path}: {key} = {exp[key]!r} gives config key {config_key} = {out[name]}: "
                                   f"{err.message}") from None
    names = exp.get("channelNames")
    if isinstance(names, dict):
        names = names.get("channelNamesArray")
    if isinstance(names, list) and names:
        out["markers"] = [clean_marker_name(str(n), path) for n in names]
    return out


def clean_marker_name(name: str, source) -> str:
    """A marker name without control characters (they make the OME-XML of every file that carries the
    name unreadable): removed, and the log says so."""
    import logging
    import unicodedata

    cleaned = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C").strip()
    if cleaned != name:
        logging.getLogger("plexgpu").warning("%s: marker name %r holds control characters: used as %r", source, name,
                                             cleaned)
    if not cleaned:
        raise RawDataError(f"{source}: marker name {name!r} is nothing but control characters")
    return cleaned


def read_marker_file(path: str | Path) -> list[str]:
    """One marker per line (cycle-major), blank lines ignored; UTF-8 (a byte-order mark is dropped)."""
    path = Path(path)
    if not path.is_file():
        raise RawDataError(f"markers file {path} not found (config key markers_file)")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise RawDataError(f"{path}: not UTF-8 text (byte {exc.start}); save the marker names as UTF-8") from None
    return [clean_marker_name(line.strip(), path) for line in text.split("\n") if line.strip()]
