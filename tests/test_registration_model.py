"""Registration that holds at every point of the mosaic (image/registration.py): rigid, then local,
measured block by block on held-out blocks, on real texture (the wsi_brain mosaic of
../shared/realdata) moved as a re-seated slide comes back (bench/registration_mosaic.py makes the
cycles: rotation, stage error, smooth deformation, noise, a bleached region)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import REPO
from plexgpu import xp as xpmod
from plexgpu.image import registration

pytestmark = pytest.mark.slow                     # real-data registrations: the full tier
sys.path.insert(0, str(REPO / "bench"))
import registration_mosaic as bench  # noqa: E402


@pytest.fixture(scope="module")
def mosaic(realdata):
    ref = bench.real_mosaic()
    h, w = ref.shape
    return ref[(h - 1536) // 2:(h + 1536) // 2, (w - 1536) // 2:(w + 1536) // 2].copy()


def _worst(ref, mov, model, xp=np, **kw):
    ref_d, mov_d = xpmod.to_device(ref, xp), xpmod.to_device(mov, xp)
    tr = registration.register_cycle(ref_d, mov_d, "cyc002", model=model, **kw)
    reg = xpmod.to_host(registration.apply_transform(mov_d, tr, ref.shape))
    res, ok = registration.local_residuals(ref, reg, 128, registration.coverage(mov.shape, tr, ref.shape))
    v = res[ok]
    return float(v.max()), float((v <= 0.5).mean()), tr


def test_rotation_and_deformation_every_block_within_half_a_pixel(mosaic):
    """0.5 deg and a 2.5 px smooth deformation: one translation leaves blocks px off (or refuses the
    cycle: the rotation smears its peak); the local model brings every held-out block within 0.5 px."""
    mov = bench.make_cycle(mosaic, "rot0.5+deform2.5", 3)
    worst, within, tr = _worst(mosaic, mov, "local")
    assert worst <= 0.5 and within == 1.0, (worst, within)
    assert tr.rotation_deg == pytest.approx(0.5, abs=0.03)
    rigid_worst, _, _ = _worst(mosaic, mov, "rigid")
    assert rigid_worst > 1.0                                  # the deformation is real: rigid alone leaves it
    try:
        t_worst, _, _ = _worst(mosaic, mov, "translation")
        assert t_worst > 1.0
    except registration.RegistrationError:
        pass


def test_rotation_alone_is_rigid_and_no_worse_on_a_pure_translation(mosaic, xp):
    mov = bench.make_cycle(mosaic, "rot0.35", 1)
    worst, _, tr = _worst(mosaic, mov, "rigid", xp)
    assert worst <= 0.1 and tr.rotation_deg == pytest.approx(0.35, abs=0.01), (worst, tr.rotation_deg)
    mov = bench.make_cycle(mosaic, "translation", 2)
    for model in ("translation", "local"):
        worst, _, tr = _worst(mosaic, mov, model, xp)
        assert worst <= 0.1, (model, worst)                   # today's translation-only level or better
        assert (tr.dy, tr.dx) == pytest.approx((3.3, -5.7), abs=0.05)


def test_a_bleached_region_takes_its_neighbours_values_never_a_wild_vector(mosaic):
    mov = bench.make_cycle(mosaic, "rot0.3+deform2+bleached", 5)
    worst, within, tr = _worst(mosaic, mov, "local")
    assert within >= 0.95 and worst <= 0.75, (worst, within)
    assert not tr.measured.all()                              # the bleached blocks were not measured ...
    assert float(np.abs(tr.field_dy).max()) < 3 and float(np.abs(tr.field_dx).max()) < 3   # ... nor made up


def test_smooth_field_fills_gaps_and_refuses_an_outlier():
    ry = np.full((5, 5), 1.0)
    rx = np.zeros((5, 5))
    measured = np.ones((5, 5), bool)
    measured[2, 2] = False
    ry[1, 1] = 9.0                                            # a wild block among agreeing neighbours
    fy, fx, used, rigid_only = registration.smooth_field(ry, rx, measured, 1.0)
    assert not used[1, 1] and fy[1, 1] == pytest.approx(1.0, abs=0.01) and fy[2, 2] == pytest.approx(1.0, abs=0.01)
    assert not rigid_only.any()
    fy, _, _, rigid_only = registration.smooth_field(ry, rx, np.zeros((5, 5), bool), 1.0)
    assert rigid_only.all() and not fy.any()                 # nothing measured: the rigid model alone


def test_a_bending_field_keeps_its_blocks_and_still_refuses_a_wild_one():
    """Smooth warps of 4 px over ~11 blocks (bench/registration_mosaic.py's, 128 px blocks) bend and slope by
    up to 2 px from block to block: every block of them is kept (the neighbours' median left crests and the
    grid's corners out: 39 of these 40 fields lost good blocks); a wild block on them is still left out, its
    neighbours kept."""
    y, x = np.mgrid[0:12, 0:12].astype(float)
    plane = np.stack([np.ones(144), y.ravel(), x.ravel()], 1)
    rng = np.random.default_rng(1)
    for _ in range(40):
        ph = rng.uniform(0, 2 * np.pi, 4)
        ry = 4 * np.sin(2 * np.pi * y / 10.8 + ph[0]) * np.cos(2 * np.pi * x / 13.2 + ph[1])
        rx = 4 * np.sin(2 * np.pi * y / 10.8 + ph[2]) * np.cos(2 * np.pi * x / 13.2 + ph[3])
        for r in (ry, rx):         # what is left after the rigid fit, measured to a few hundredths of a px
            r -= (plane @ np.linalg.lstsq(plane, r.ravel(), rcond=None)[0]).reshape(12, 12)
            r += rng.normal(0, 0.03, r.shape)
        measured = np.ones((12, 12), bool)
        _, _, used, _ = registration.smooth_field(ry, rx, measured, 1.0)
        assert used.all(), np.argwhere(~used).tolist()
        wild = ry.copy()
        at = tuple(rng.integers(1, 11, 2))
        wild[at] += rng.choice([-1, 1]) * rng.uniform(3, 8)
        fy, _, used, _ = registration.smooth_field(wild, rx, measured, 1.0)
        assert np.argwhere(~used).tolist() == [list(at)]
        assert abs(fy[at] - ry[at]) < 0.5 * abs(wild[at] - ry[at])   # filled from its neighbours (their mean)


def test_blocks_batched_few_syncs_and_the_device_memory_plan_predicts(mosaic, monkeypatch):
    """Under the strict stand-in (CuPy's rules, a ledger of syncs and device bytes): a registration as the
    stage runs it (register, two channels moved, the residual measured) waits on the device a bounded
    number of times, not several times per block (before the blocks were batched: 1,703 syncs on a
    1024-px crop of 64 blocks, here 15x15 blocks), and its peak device memory is what plexgpu plan
    predicts (gpu_memory.registration_peak) within 15 %, with strips of 1/12 of the rows as at full size
    (1024 of ~12,000)."""
    from plexgpu import gpu_memory
    from strict_device import LEDGER, STRICT

    ref = mosaic[:1536, :1536]
    mov = bench.make_cycle(ref, "rot0.5+deform2.5", 4)
    monkeypatch.setattr(registration, "STRIP_ROWS", 128)
    LEDGER.reset()
    base = LEDGER.live_bytes
    r, m = xpmod.to_device(ref, STRICT), xpmod.to_device(mov, STRICT)
    tr = registration.register_cycle(r, m, "cyc002", model="local", block_px=128)
    for ch in range(2):
        img = m if ch == 0 else xpmod.to_device(mov, STRICT)
        moved = registration.apply_transform(img, tr, ref.shape)
        if ch == 0:
            covered = xpmod.to_host(registration.coverage(tuple(img.shape), tr, ref.shape, STRICT))
            res, ok = registration.local_residuals(r, moved, 128, covered)
        xpmod.to_host(moved)
        del moved, img
    assert tr.blocks_total == 144 and ok.sum() >= 100 and np.nanmax(res) <= 0.5
    assert LEDGER.syncs <= 40, LEDGER.syncs
    predicted = gpu_memory.registration_peak(ref.shape, 128)
    measured = LEDGER.peak_bytes - base
    print(f"syncs {LEDGER.syncs}, device calls {LEDGER.device_calls}, peak {measured / 1e6:.1f} MB, "
          f"predicted {predicted / 1e6:.1f} MB")
    assert 0.85 <= measured / predicted <= 1.15, (measured, predicted)
