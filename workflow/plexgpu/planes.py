"""``stitched/<cycle>/planes.json``: what the stitch stage learnt of every (channel, z-plane), read
by the EDF stage (quality gate, footprints of faulty tiles) and by the QC rules. One typed record,
written and read here only."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class PlanesRecord:
    #: {channel: {z: [per-tile statistics of the raw plane (image.edf.tile_stats)]}}, keys as strings
    recorded: dict[str, dict[str, list[dict]]]
    #: {channel: pixels above 65535 after flat/dark correction, set to 65535}
    saturated_after_correction: dict[str, int] = field(default_factory=dict)
    #: {"<channel>/<z>": the plane's flatfield refinement and camera offset (stages._shading_record)}
    shading: dict[str, dict] = field(default_factory=dict)
    #: per tile (tile order) its footprint in the mosaic: [y, x, height, width]
    footprints: list[list[int]] = field(default_factory=list)
    #: {channel: its one camera offset for all planes: counts, standard_error, per_plane (each plane's own
    #: estimate, diagnostics), light_floor, uncertain, model ("per column" or "affine":
    #: shading.ChannelOffset.model)} where the offset is fitted
    offsets: dict[str, dict] = field(default_factory=dict)
    #: the sensor's defective pixels found and repaired, by kind (image.defects; listed in basic/<cycle>/defects.csv)
    defective_pixels: dict[str, int] = field(default_factory=dict)

    def tile_stats(self, channel: int | str) -> list[list[dict]]:
        """A channel's per-tile statistics, plane by plane (z = 1, 2, ...)."""
        planes = self.recorded[str(channel)]
        return [planes[z] for z in sorted(planes, key=int)]

    def write(self, path: str | Path) -> None:
        from .io.tiff import write_text_atomic

        write_text_atomic(path, json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: str | Path) -> "PlanesRecord":
        data = json.loads(Path(path).read_text())
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
