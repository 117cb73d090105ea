"""The config contract: load YAML files, validate them against the one schema.

The schema lives in ``config/schema/config.schema.yaml`` at the root of the
checkout; the workflow (Snakefile) and the CLI both validate through
``validate_config`` so defaults exist in exactly one place: the schema.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Iterable

import yaml

#: root of the checkout (workflow/plexgpu/config.py -> ../../)
REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "config" / "schema" / "config.schema.yaml"


@functools.lru_cache(maxsize=1)
def schema() -> dict:
    """The config schema, parsed once per process (every Snakefile parse, the jobs' too, reads it)."""
    return yaml.safe_load(SCHEMA_PATH.read_text())


class ConfigError(ValueError):
    """A config mistake, stated in one line naming the key."""


def _deep_update(base: dict, new: dict) -> dict:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def read_config_files(paths: Iterable[str | Path]) -> dict:
    """Merge YAML config files in order (later files win), like snakemake --configfile."""
    merged: dict = {}
    for path in paths:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"config file {path} is a folder, not a YAML file")
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:                       # unreadable by this user, a folder, ...
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}".replace("\n", " ")) from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of keys, not {type(data).__name__}")
        _check_size(data, path)
        _deep_update(merged, data)
    return merged


def _key_path(error) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "<top level>"


CHANNEL_MAPS = (("optics", "emission_nm"), ("deconvolution", "psf_file"), ("basic", "darkfield"))  # {channel: ..}


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Validate ``config`` in place against the schema and fill in its defaults.

    Raises ConfigError with one line naming the offending key. Asks no cluster anything:
    ``gpu_slots: auto`` stays as it is until ``cluster.slurm.resolve_auto_slots`` asks SLURM on purpose.
    """
    import jsonschema
    from snakemake.utils import validate

    _check_size(config, "given")                 # what Snakemake read, in each job's parse too
    for section, key in CHANNEL_MAPS:       # YAML reads `1: 461` with an int key; the schema (JSON) speaks strings
        part = config.get(section)
        if isinstance(part, dict) and isinstance(part.get(key), dict):
            part[key] = {str(k): v for k, v in part[key].items()}
    try:
        validate(config, str(SCHEMA_PATH))
    except Exception as exc:  # snakemake wraps jsonschema's error in a WorkflowError
        cause = exc
        while cause is not None and not isinstance(cause, jsonschema.ValidationError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise ConfigError(f"config does not match the schema: {exc}".replace("\n", " ")) from None
        raise ConfigError(_describe(cause)) from None
    names = [a["name"] for a in config.get("accounts", [])]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"config key accounts: {', '.join(twice)} listed more than once; give each account once "
                          "with all its gpu_slots")
    return config


def _describe(error) -> str:
    """One line naming the key of a jsonschema ValidationError."""
    where = _key_path(error)
    if error.validator == "additionalProperties":
        # name the unexpected key itself, with its full path
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        if extra:
            base = "" if where == "<top level>" else where + "."
            return (f"config key {base}{extra[0]} is not allowed (unknown key, maybe a typo); "
                    f"allowed here: {', '.join(sorted(error.schema.get('properties', {})))}")
    if error.validator == "pattern" and error.schema.get("description"):
        return f"config key {where} = {error.instance!r}: {error.schema['description']}"
    if error.validator == "required":
        return f"config key {error.message.split(chr(39))[1]} is required ({where})"
    if error.validator in ("oneOf", "anyOf") and error.context:
        # "is not valid under any of the given schemas" names nothing: say what each alternative wants
        wants = "; or ".join(dict.fromkeys(e.message.replace(repr(error.instance), "it", 1) for e in error.context))
        return f"config key {where} = {error.instance!r}: {wants}"
    return f"config key {where}: {error.message}"


#: a config holds a few hundred values; YAML aliases can make a short file expand to billions
MAX_CONFIG_VALUES = 100_000


def _check_size(data, path) -> None:
    """Refuse a config that expands (YAML aliases of aliases: 'billion laughs') beyond MAX_CONFIG_VALUES
    values, counting no further than that: validating it walked every expanded value for minutes."""
    count, stack = 0, [data]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(f"config file {path} expands to more than {MAX_CONFIG_VALUES} values (YAML aliases of "
                              "aliases?): not a plexgpu config")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def load_config(paths: Iterable[str | Path], overrides: dict | None = None, slots: bool = False) -> dict[str, Any]:
    """Read, merge and validate config files; the single entry point of the CLI. ``slots``: also
    resolve ``gpu_slots: auto`` from SLURM (the commands that assign cycles or size ``-j``)."""
    config = read_config_files(paths)
    if overrides:
        _deep_update(config, overrides)
    validate_config(config)
    if slots:
        from .cluster.slurm import resolve_auto_slots

        resolve_auto_slots(config)
    return config
