"""Honest GPU accounting: per device model and MIG profile, never summed, with the arithmetic."""

import json
import re

import pytest

from plexgpu.cluster import report
from plexgpu.cluster.accounting import JobRecorder, load_records


def _record(folder, rule, cycle, job, model=None, mig=None, elapsed=3600.0, gpus=1, util=80.0, mem=60.0,
            cpu_eff=90.0, runtime=120):
    device = {"used": False, "note": "no GPU device was used"}
    if model:
        device = {"used": True, "vendor": "NVIDIA", "model": model, "uuid": f"GPU-{job}",
                  "kind": "MIG slice" if mig else "whole device", "mig_profile": mig,
                  "memory_total_bytes": 80 * 2**30}
    rec = {"rule": rule, "cycle": cycle, "status": "completed", "slurm": {"job_id": f"fx{job}", "account": "clive",
           "partition": "gpu"}, "allocated_gpus": gpus, "requested": {"cpus_per_task": 4, "runtime": runtime},
           "start": 1000.0 + job * 10, "end": 1000.0 + job * 10 + elapsed, "elapsed_s": elapsed, "device": device,
           "gpu_samples": {"gpu_util_mean_pct": util, "gpu_mem_peak_pct": mem} if model else None,
           "cpu_efficiency_pct": cpu_eff, "peak_rss_bytes": 2**30}
    (folder / f"{rule}-{cycle}-fx{job}.json").write_text(json.dumps(rec))


@pytest.fixture
def mixed(tmp_path):
    jobs = tmp_path / "accounting" / "jobs"
    jobs.mkdir(parents=True)
    for j in range(3):
        _record(jobs, "stitch", f"cyc00{j + 1}", j, model="NVIDIA H200", elapsed=1800)
    for j in range(3, 5):
        _record(jobs, "deconvolve", f"cyc00{j - 2}", j, model="NVIDIA B200", elapsed=3600)
    for j in range(5, 13):
        _record(jobs, "edf", f"cyc{j:03d}", j, model="NVIDIA H100 80GB HBM3", mig="3g.40gb", elapsed=5 * 3600)
    return tmp_path


def test_device_models_and_mig_profiles_on_separate_lines(mixed):
    allocs = report.collect(mixed / "accounting" / "jobs", use_sacct=False)
    lines = {s["group"]: s for s in report.usage_statements(allocs)}
    assert set(lines) == {"NVIDIA H200 (whole device)", "NVIDIA B200 (whole device)",
                          "NVIDIA H100 80GB HBM3 3g.40gb MIG slice"}
    assert "We used 3 allocations of one whole NVIDIA H200 each, for 1.500 h elapsed in total: 1.500 H200 " \
           "GPU-hours" in lines["NVIDIA H200 (whole device)"]["text"]
    assert "We used 8 allocations of one NVIDIA H100 80GB HBM3 3g.40gb MIG slice each, for 40.000 h elapsed in " \
           "total: 40.000 H100 3g.40gb slice-hours" in lines["NVIDIA H100 80GB HBM3 3g.40gb MIG slice"]["text"]
    md = report.markdown(allocs)
    assert "47.500" not in md and "45.500" not in md  # nothing adds unlike allocations together


def test_arithmetic_recomputes_from_the_table(mixed):
    md_path, html_path, allocs = report.write_report(mixed, use_sacct=False)
    md = md_path.read_text()
    rows = [r.split("|")[1:-1] for r in md.splitlines() if r.startswith("| ") and "fx" in r]
    table = {}
    for r in rows:
        device, gpus, elapsed = r[5].strip(), int(r[6]), float(r[7])
        table[device] = table.get(device, 0) + gpus * elapsed
    for st in report.usage_statements(allocs):
        m = re.search(r"= ([\d.]+) s = ([\d.]+) h$", st["text"])
        assert m and float(m.group(1)) == pytest.approx(table[st["group"]], abs=1)
        terms = re.findall(r"(\d+) × (\d+) s", st["text"])
        assert sum(int(g) * int(e) for g, e in terms) == pytest.approx(table[st["group"]], abs=1)
    assert "<svg" in html_path.read_text()


def test_report_card_flags_with_numbers(tmp_path):
    jobs = tmp_path / "accounting" / "jobs"
    jobs.mkdir(parents=True)
    _record(jobs, "stitch", "cyc001", 1, model="NVIDIA H200", elapsed=600, util=20, mem=10, cpu_eff=15,
            runtime=120)
    cards = {c["rule"]: c for c in report.report_card(report.collect(jobs, use_sacct=False))}
    advice = " ".join(cards["stitch"]["advice"])
    assert "GPU utilisation 20 % < 50 %: data starvation" in advice and "cpus_per_task - 1 = 3" in advice
    assert "GPU memory peak 10 % < 40 %" in advice
    assert "CPU efficiency 15 % < 50 % of 4 cores (about 0.6 busy)" in advice and "cpus_per_task = 1" in advice
    assert "time used 8 % < 25 %" in advice and "runtime = 20" in advice


def test_report_card_never_asks_one_core_for_fewer(tmp_path):
    """'37 % of 1 cores: ask for fewer (about 2)' contradicted itself."""
    jobs = tmp_path / "accounting" / "jobs"
    jobs.mkdir(parents=True)
    _record(jobs, "stitch", "cyc001", 1, model="NVIDIA H200", elapsed=600, util=90, mem=60, cpu_eff=37, runtime=20)
    rec = next(jobs.glob("*.json"))
    data = __import__("json").loads(rec.read_text())
    data["requested"]["cpus_per_task"] = 1
    rec.write_text(__import__("json").dumps(data))
    advice = " ".join(report.report_card(report.collect(jobs, use_sacct=False))[0]["advice"])
    assert "ask for fewer" not in advice and "nothing to take away" in advice


def test_timeline_has_a_time_axis(tmp_path):
    jobs = tmp_path / "accounting" / "jobs"
    jobs.mkdir(parents=True)
    _record(jobs, "stitch", "cyc001", 1, model="NVIDIA H200", elapsed=600)
    svg = report._timeline_svg(report.collect(jobs, use_sacct=False))
    assert ">0 min</text>" in svg and ">10 min</text>" in svg


def test_record_written_also_on_failure_and_says_no_device(tmp_path):
    rec = JobRecorder("deconvolve", "cyc004", tmp_path, "cpu", requested={"cpus_per_task": 2, "runtime": 5})
    path = rec.finish("failed", "RuntimeError: boom")
    data = load_records(tmp_path)[0]
    assert path.name.startswith("deconvolve-cyc004-") and data["status"] == "failed"
    assert data["device"]["used"] is False and "no GPU device was used" in data["device"]["note"]
    assert data["error"] == "RuntimeError: boom" and data["peak_rss_bytes"] > 0


def test_a_cycle_group_job_is_one_allocation_and_its_card_names_the_stages(tmp_path):
    """A cycle's stitch, deconvolve and edf ran in one SLURM allocation (one job id): the report counts
    one allocation of that cycle, not three, and the report card still compares each stage on its own."""
    jobs = tmp_path / "accounting" / "jobs"
    jobs.mkdir(parents=True)
    for rule, elapsed, util in (("edf", 300, 30), ("stitch", 600, 90), ("deconvolve", 1200, 95)):
        _record(jobs, rule, "cyc001", 7, model="NVIDIA H200", elapsed=elapsed, util=util)
        rec = jobs / f"{rule}-cyc001-fx7.json"
        data = json.loads(rec.read_text())
        data["start"] = 1000.0 + 2000 * (("stitch", "deconvolve", "edf").index(rule))
        rec.write_text(json.dumps(data))
    _record(jobs, "stitch", "cyc002", 8, model="NVIDIA H200", elapsed=600)
    allocs = report.collect(jobs, use_sacct=False)
    assert sorted((a.job_id, a.rule) for a in allocs) == [("fx7", "stitch+deconvolve+edf"), ("fx8", "stitch")]
    group = next(a for a in allocs if a.job_id == "fx7")
    assert group.elapsed_s == 600 + 1200 + 300 and [u.rule for u in group.stages] == ["stitch", "deconvolve", "edf"]
    (line,) = report.usage_statements(allocs)
    assert line["allocations"] == 2 and line["gpu_seconds"] == 2100 + 600
    (one,) = report.usage_statements(allocs[1:] if allocs[0].job_id == "fx7" else allocs[:1])
    assert one["text"].startswith("We used 1 allocation of one whole NVIDIA H200 each")       # not "1 allocations"
    cards = {c["rule"]: c for c in report.report_card(allocs)}
    assert {r: cards[r]["jobs"] for r in cards} == {"stitch": 2, "deconvolve": 1, "edf": 1}
    assert cards["edf"]["gpu_util_mean_pct"] == 30 and "data starvation" in " ".join(cards["edf"]["advice"])
