"""EDF against the sharp synthetic truth, and cross-cycle registration to half a pixel."""

import numpy as np
import pytest
from scipy import ndimage

from plexgpu import edf, registration
from plexgpu import xp as xpmod
from plexgpu.synth import SynthDataset, SynthSpec


@pytest.fixture(scope="module")
def synth():
    return SynthDataset(SynthSpec(cycles=3, rows=2, cols=2, tile=(256, 256), z_planes=7, channels=2, seed=9))


def _corr(a, b):
    return np.corrcoef(a.ravel(), b.ravel())[0, 1]


def test_edf_matches_sharp_truth_and_beats_max_projection(synth, xp):
    stack = synth.stack(1, 1)
    sharp = synth.in_focus(1, 1)  # what a perfectly focused widefield image shows
    depth = synth.depth_map(1)
    oracle = np.take_along_axis(stack, np.rint(depth).astype(int)[None], 0)[0]  # plane nearest the true depth
    res = edf.extended_depth_of_field(xpmod.to_device(stack, xp), radius=3, sigma=4.0)
    out = xpmod.to_host(res.image)
    c_edf, c_max = _corr(out, sharp), _corr(xpmod.to_host(edf.max_projection(xpmod.to_device(stack, xp))), sharp)
    c_oracle = _corr(oracle, sharp)
    print(f"EDF correlation with the in-focus truth {c_edf:.4f}, oracle plane choice {c_oracle:.4f}, "
          f"max projection {c_max:.4f}")
    # better than the best single plane per pixel (interpolation through focus), far above a max projection
    assert c_edf >= 0.998 and c_edf > c_oracle and c_edf > c_max
    # the focus map follows the true depth
    tissue = synth.tissue[:depth.shape[0], :depth.shape[1]] > 0.9
    err = np.abs(xpmod.to_host(res.focus_index) - depth)[tissue]
    assert np.median(err) < 0.5


def test_quality_gate_drops_bad_planes_and_fails_below_three():
    rng = np.random.default_rng(0)
    stack = rng.integers(100, 1000, (5, 64, 64)).astype(np.uint16)
    stack[0, :20] = 0          # 31 % zeros
    stack[4, :10] = 65535      # 16 % saturated
    kept, dropped = edf.quality_gate(edf.plane_stats(stack, 65535))
    assert kept == [1, 2, 3] and set(dropped) == {0, 4}
    stack[2, :30] = 0
    with pytest.raises(edf.EDFError, match="only 2 of 5 z-planes usable.*Z001.*zero.*Z003.*Z005: 16% saturated"):
        edf.quality_gate(edf.plane_stats(stack, 65535))


def test_edf_uses_only_kept_planes(synth, xp):
    stack = synth.stack(1, 1) + 0.1   # recorded data sits on an offset: never exactly zero
    stack[3] = 0.0  # a dead plane: dropped by the gate, never chosen
    kept, _ = edf.quality_gate(edf.plane_stats(stack, None))
    assert 3 not in kept
    res = edf.extended_depth_of_field(xpmod.to_device(stack, xp), kept=kept)
    assert _corr(xpmod.to_host(res.image), synth.in_focus(1, 1)) > 0.98


@pytest.mark.parametrize("shift", [(3.0, -7.0), (3.4, -7.6), (-20.0, 25.0), (0.0, 0.0)])
def test_registration_recovers_shift(synth, xp, shift):
    ref = synth.specimen(1, 1)
    h, w = ref.shape
    assert max(abs(shift[0]) / h, abs(shift[1]) / w) <= 0.1
    moving = ndimage.shift(ref, shift, order=1) + np.random.default_rng(1).normal(0, 0.01, ref.shape)
    s = registration.measure_shift(xpmod.to_device(ref, xp), xpmod.to_device(moving.astype(np.float32), xp), "cyc002")
    print(f"true {shift}, measured ({s.dy:.2f}, {s.dx:.2f}), significance {s.significance:.0f} > {s.threshold:.1f}")
    assert abs(s.dy - shift[0]) <= 0.5 and abs(s.dx - shift[1]) <= 0.5
    back = xpmod.to_host(registration.apply_shift(xpmod.to_device(moving.astype(np.float32), xp), s, ref.shape))
    m = 40
    assert _corr(back[m:-m, m:-m], ref[m:-m, m:-m]) > 0.99


def test_synthetic_cycles_register(synth, xp):
    ref = synth.specimen(1, 1)
    for cycle in (2, 3):
        dy, dx = synth.cycle_shifts[cycle - 1]
        s = registration.measure_shift(xpmod.to_device(ref, xp), xpmod.to_device(synth.specimen(cycle, 1), xp),
                                       f"cyc{cycle:03d}")
        # the frame moved by (dy, dx) over the specimen: content appears shifted by (-dy, -dx)
        assert abs(s.dy + dy) <= 0.5 and abs(s.dx + dx) <= 0.5


def test_unrelated_image_refused(synth, xp):
    ref = synth.specimen(1, 1)
    other = SynthDataset(SynthSpec(cycles=1, rows=2, cols=2, tile=(256, 256), z_planes=3, channels=1,
                                   seed=1234)).specimen(1, 1)
    with pytest.raises(registration.RegistrationError, match="cycle cyc007: no reliable match"):
        registration.measure_shift(xpmod.to_device(ref, xp), xpmod.to_device(other, xp), "cyc007")
