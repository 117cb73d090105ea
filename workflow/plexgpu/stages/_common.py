"""What every stage module shares: one path per channel of a stage's per-channel inputs or outputs."""

from __future__ import annotations

from ..experiment import CycleSpec


def per_channel(spec: CycleSpec, files) -> dict:
    """{channel: path} from a stage's per-channel output (one path per channel of ``spec.channels``)."""
    files = list(files)
    if len(files) != len(spec.channels):
        raise ValueError(f"{len(files)} paths for the {len(spec.channels)} channels of {spec.key}")
    return dict(zip(spec.channels, files))
