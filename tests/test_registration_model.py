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
