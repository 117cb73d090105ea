"""One camera across cycles: the offset of each channel that the cycles give together.

The camera (and its readout mode) does not change between the cycles of an experiment, so neither does its
offset. Each cycle's stitch job fits it from that cycle's tiles alone (``planes.json`` offsets: counts and
standard error per channel); a cycle whose tiles cannot pin it down (a Blank cycle: autofluorescence only, a
dense stain) gets a value the other cycles contradict, and a dim marker then reads brighter or darker in that
cycle only. Here the cycles' fits are combined: the cycle furthest from the others, when it lies more than
CAMERA_SIGMAS combined standard errors from their inverse-variance weighted mean and further than a tenth of
its dimmest light floor, is set aside, again until the rest agree; the rest give the channel's offset. The
registration stage brings every cycle to it (``basic.shared_camera``), the QC page names the cycles set aside,
and those that agree but whose own offset, which their stitched and EDF stacks keep, lies noticeably from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .image.shading import MIN_UNCERTAINTY, UNCERTAIN_OF_FLOOR

CAMERA_SIGMAS = 3.0     # a cycle's offset this many combined standard errors from the other cycles' is set aside


def noticeable(counts: float, light_floor: float) -> bool:
    """Whether an offset wrong by ``counts`` matters to the light it is subtracted from: by more than a tenth of
    the dimmest light floor (UNCERTAIN_OF_FLOOR, the share an offset may be uncertain by) and MIN_UNCERTAINTY."""
    return abs(counts) > max(UNCERTAIN_OF_FLOOR * light_floor, MIN_UNCERTAINTY)


@dataclass
class Disagreement:
    counts: float            # the cycle's own fitted offset
    standard_error: float
    others: float            # what the agreeing cycles give together
    combined_error: float    # the standard error of the difference


@dataclass
class CameraOffset:
    """A channel's camera offset over the cycles: ``counts`` is None where no two cycles agree (then each
    cycle keeps its own)."""
    channel: str
    counts: float | None
    standard_error: float | None
    cycles: list[str]                                       # the agreeing cycles it comes from
    own: dict[str, tuple[float, float]] = field(default_factory=dict)   # every cycle's (counts, standard error)
    set_aside: dict[str, Disagreement] = field(default_factory=dict)
    stacks_apart: dict[str, float] = field(default_factory=dict)  # agreeing cycles whose own offset, which their
    # stacks keep, lies noticeably from the camera's: the counts a dim marker reads there against plex.ome.tif

    def correction(self, cycle: str) -> float:
        """Counts to add to a cycle's light (divided by its flatfield) to bring it to the channel's offset:
        its own offset minus the channel's (0 where there is none)."""
        if self.counts is None or cycle not in self.own:
            return 0.0
        return self.own[cycle][0] - self.counts


def across_cycles(offsets: dict[str, dict]) -> dict[str, CameraOffset]:
    """``offsets``: {cycle: {channel: the stitch job's offset record (counts, standard_error, light_floor)}}
    -> {channel: CameraOffset}, channels in order."""
    out = {}
    for ch in sorted({ch for per in offsets.values() for ch in per}, key=int):
        got = {c: per[ch] for c, per in offsets.items() if ch in per}
        own = {c: (float(o["counts"]), float(o["standard_error"])) for c, o in got.items()}

        def error(c):
            return max(own[c][1], MIN_UNCERTAINTY)

        def together(cycles):            # inverse-variance mean and its standard error
            w = np.array([1 / error(c) ** 2 for c in cycles])
            return float(w @ [own[c][0] for c in cycles] / w.sum()), float(1 / np.sqrt(w.sum()))

        def apart(c, rest):              # how many combined errors c lies from the rest, if it is to be set aside
            m, m_se = together(rest)
            diff, combined = abs(own[c][0] - m), float(np.hypot(error(c), m_se))
            far = diff > CAMERA_SIGMAS * combined and noticeable(diff, got[c]["light_floor"])
            return diff / combined if far else 0.0

        keep, aside = list(got), []
        while len(keep) > 1:
            score, worst = max((apart(c, [k for k in keep if k != c]), c) for c in keep)
            if not score:
                break
            aside.append(worst)
            keep.remove(worst)
        m, m_se = together(keep)                     # a cycle set aside, against all the agreeing ones
        set_aside = {c: Disagreement(*own[c], m, float(np.hypot(error(c), m_se))) for c in aside}
        if len(keep) == 1 and len(got) > 1:          # no two cycles agree: none is the camera's
            out[ch] = CameraOffset(ch, None, None, [], own, set_aside)
        else:
            apart_in_stacks = {c: m - own[c][0] for c in keep if noticeable(m - own[c][0], got[c]["light_floor"])}
            out[ch] = CameraOffset(ch, m, m_se, keep, own, set_aside, apart_in_stacks)
    return out
