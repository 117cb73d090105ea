"""The stage registry (plexgpu.paths.PIPELINE) is the one place a stage is declared: the rules'
outputs are the registry's, and a stage added there is seen by every reader."""

from __future__ import annotations

import pytest
import yaml

from plexgpu import paths
from workflow_api import job_outputs


def test_every_rules_outputs_are_the_registrys(tmp_path, small_synth):
    """A dry run's jobs: each stage's rule declares exactly the registry's named outputs, in its
    order, with the registry's paths (per cycle, and over all cycles for registration)."""
    raw, ds = small_synth
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"raw_dir": str(raw), "results_dir": str(tmp_path / "results"),
                                   "compute": {"device": "cpu"}}))
    jobs = job_outputs(tmp_path, cfg)
    channels = list(range(1, ds.spec.channels + 1))
    cycles = [f"cyc{c:03d}" for c in range(1, ds.spec.cycles + 1)]
    seen = set()
    for (rule, cycle), outputs in jobs.items():
        st = paths.stage(rule)
        expected = paths.outputs(rule, tmp_path / "results", channels, cycle, cycles)
        assert list(outputs) == [name for name, _ in st.outputs], rule
        assert outputs == {k: [v] if isinstance(v, str) else v for k, v in expected.items()}, (rule, cycle)
        seen.add(rule)
    assert seen == {s.name for s in paths.PIPELINE}
    assert sum(1 for r, _ in jobs if r == "stitch") == len(cycles)


@pytest.mark.slurm     # its dry run asks squeue which jobs run: a cluster must answer
def test_a_stage_added_to_the_registry_is_seen_everywhere(monkeypatch, tmp_path, slurm_cluster):
    """A stage inserted in the registry (say background subtraction after stitch) is a GPU stage with
    its rank for the scheduler, a row of `plexgpu status`, a line of a failed run's summary, a stage of
    the simulator and of `plan --simulate`'s minutes, a column of the QC page and a colour of the
    report -- with no other list to edit."""
    import json

    from plexgpu import cli, qc_page
    from plexgpu.cluster import rerun, report, simulate, slurm

    new = paths.Stage("background", (("background", "background/{cycle}/CH{ch}.ome.tif"),),
                      minutes=(2.0, 30.0), colour="#123456")
    monkeypatch.setattr(paths, "PIPELINE", paths.PIPELINE[:1] + (new,) + paths.PIPELINE[1:])
    assert paths.cycle_stages() == ("stitch", "background", "deconvolve", "edf")
    assert paths.gpu_stage_rank("background") == 2 and paths.gpu_stage_rank("registration") == 5
    assert paths.stage_files(tmp_path, "background", "cyc001", [1, 2]) == [
        tmp_path / "background/cyc001/CH1.ome.tif", tmp_path / "background/cyc001/CH2.ome.tif"]
    assert paths.outputs("background", "R", [1, 2]) == {"background": ["R/background/{cycle}/CH1.ome.tif",
                                                                       "R/background/{cycle}/CH2.ome.tif"]}
    rows = rerun.status(tmp_path, tmp_path, ["cyc001"], [1], "plexgpu-test")
    assert [(r.cycle, r.stage) for r in rows] == [("cyc001", "stitch"), ("cyc001", "background"),
                                                  ("cyc001", "deconvolve"), ("cyc001", "edf"),
                                                  ("all", "registration")]
    assert "cyc001: stitch, background, deconvolve, edf" in rerun.next_steps(tmp_path, ["cyc001"], [1], ["c.yaml"])
    # the simulator and plan --simulate: one minute figure per stage, the registry's by default
    sim = simulate.simulate(2, [{"name": "a", "gpu_slots": 1}])
    assert [j[2] for j in sim.jobs if j[1] == "cyc001"] == ["stitch", "background", "deconvolve", "edf"]
    assert sim.makespan_min == 2 * (8 + 2 + 12 + 1.5)                 # one slot: the two cycles one after the other
    args = cli.build_parser().parse_args(["plan", "--configfile", "c.yaml", "--simulate"])
    assert args.gpu_minutes == (8.0, 2.0, 12.0, 1.5) and args.cpu_minutes == (200.0, 30.0, 60.0, 22.0)
    # the QC page: a column for the new stage, which has no QC rule yet
    qc_dir = tmp_path / "qc"
    metrics = {}
    for stage, m in (("stitch", {"pairs": 0, "pairs_accepted": 0, "seam_ncc_median": None, "seam_ncc_min": None,
                                 "flat_colour_range": [1, 1], "dark_colour_range": [0, 0], "shading": {}}),
                     ("deconvolve", {"channels": {}}), ("edf", {"channels": {"CH1": {"planes": 3}}})):
        (qc_dir / stage).mkdir(parents=True)
        p = qc_dir / stage / "cyc001.json"
        p.write_text(json.dumps({"cycle": "cyc001", "status": "ok", "reasons": [], **m}))
        metrics[stage] = [str(p)]
    (qc_dir / "registration.json").write_text(json.dumps({"reasons": [], "reference_cycle": "cyc001",
                                                          "overlay": "", "shifts": []}))
    metrics["registration"] = [str(qc_dir / "registration.json")]
    for stage in paths.PIPELINE:                           # every stage done: its files are there
        for f in paths.stage_files(tmp_path, stage.name, "cyc001", [1], ["cyc001"]):
            f.parent.mkdir(parents=True, exist_ok=True)
            if f.suffix == ".tif":                         # whole (a damaged TIFF is not done)
                __import__("tifffile").imwrite(f, __import__("numpy").zeros((4, 4), "uint16"))
            else:
                f.touch()
    qc_page.write_index(str(qc_dir / "index.html"), str(qc_dir / "metrics.json"), metrics, ["cyc001"], [1])
    page = (qc_dir / "index.html").read_text()
    assert "<th>background</th>" in page and "no QC rule for this stage" in page
    assert page.index("<th>stitch</th>") < page.index("<th>background</th>") < page.index("<th>deconvolve</th>")
    # the report's timeline colours
    use = report.StageUse(rule="background", elapsed_s=1.0, time_limit_s=None, util_mean=None, mem_peak_pct=None,
                          cpu_eff=None, cpus=1, device_used=False, start=0.0, end=1.0)
    alloc = type("A", (), {"start": 0.0, "end": 1.0, "account": "a", "device_group": "g", "rule": "background",
                           "cycle": "cyc001", "job_id": "1", "elapsed_s": 1.0, "stages": [use]})()
    assert "#123456" in report._timeline_svg([alloc])
    # a cycle's group job names the new stage among its stages, in pipeline order
    assert slurm.parse_comment("rule_cycle_cyc001_background_deconvolve_edf_stitch") == (
        "stitch+background+deconvolve+edf", "cyc001")
