"""The planner suite (benchmarks/planner_suite.py) with measured profiles: a cell of a profiled model runs on the
roofline figures and again with the profiles, side by side, and a profile it cannot use is refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.planner_suite import main, measured_profiles, perf_sources
from coordinator.planner.arch import get_arch
from coordinator.planner.catalog import load_catalog
from coordinator.planner.perf import PerfModel

SLOWER = 1.5


def slow_a100_profile(model: str = "llava-1.5-7b") -> dict:
    """A 'measured' A100 profile of `model`: the roofline's own figures for that tier, SLOWER times as long (what a
    measurement that found the A100 slower than its datasheet would write)."""
    arch = get_arch(model)
    roofline = PerfModel(load_catalog(), arch)
    tokens = 576
    return {"tier": "A100", "model": model, "measured_at": "2026-12-07T00:00:00Z", "source": "test: roofline x 1.5",
            "encode": {"image": {"tokens_per_item": tokens, "points": [
                {"batch": b, "seconds": roofline.encode_s("A100", "image", b, tokens) * SLOWER} for b in (1, 2, 4, 8)]}},
            "prefill": [{"tokens": n, "seconds": roofline.prefill_s("A100", n) * SLOWER} for n in (128, 512, 1024, 4096)],
            "decode": [{"batch": b, "context_tokens": c, "seconds": roofline.decode_step_s("A100", b, c) * SLOWER}
                       for b in (1, 8, 32) for c in (512, 2048)]}


def test_profiles_are_found_by_model_and_tier_and_bad_ones_refused(tmp_path):
    (tmp_path / "a100.json").write_text(json.dumps(slow_a100_profile()))
    found = measured_profiles([tmp_path])
    assert list(found) == ["llava-1.5-7b"] and list(found["llava-1.5-7b"]) == ["A100"]
    with pytest.raises(ValueError, match="no profile at"):
        measured_profiles([tmp_path / "missing.json"])
    (tmp_path / "notes.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="notes.json is not a profile"):
        measured_profiles([tmp_path])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no"):
        measured_profiles([tmp_path / "a100.json", tmp_path / "empty"])


def test_a_cell_runs_with_the_measured_figures_only_where_they_can_change_it():
    a100 = {"A100": Path("a100.json")}
    assert [p for p, _ in perf_sources("inventory", a100)] == ["roofline", "measured"]   # 2x RTX 4090 + 2x A100
    assert [p for p, _ in perf_sources("inventory", {"H200": Path("h200.json")})] == ["roofline"]
    assert [p for p, _ in perf_sources("budget", {"H200": Path("h200.json")})] == ["roofline", "measured"]
    assert perf_sources("budget", {}) == [("roofline", ())]


def test_the_suite_reports_roofline_and_measured_side_by_side(tmp_path, capsys):
    profile = tmp_path / "a100.json"
    profile.write_text(json.dumps(slow_a100_profile()))
    out = tmp_path / "out"
    assert main(["--quick", "--trials", "6", "--requests", "40", "--eval-requests", "120",
                 "--profile", str(profile), "--out", str(out)]) == 0
    doc = json.loads((out / "planner_suite_quick.json").read_text())
    llava = [c for c in doc["cells"] if c["workload"].startswith("llava-1.5")]
    assert [c["perf"] for c in llava] == ["roofline", "measured"]
    assert all(c["perf"] == "roofline" for c in doc["cells"] if c not in llava)   # no profile of their models
    roofline, measured = (c["systems"]["planner"] for c in llava)
    assert measured["objective"] < roofline["objective"]   # A100s 1.5x slower: fewer good requests per $
    assert set(doc["summary"]) == {"roofline", "measured"} and doc["summary"]["measured"]["cells"] == 1
    table = (out / "planner_suite_quick.md").read_text()
    assert "| measured |" in table and "Measured figures: cells 1" in table and "Roofline figures: cells 4" in table
    assert (out / "planner_suite_quick.png").stat().st_size > 0


def test_a_profile_of_a_model_the_suite_does_not_run_is_refused(tmp_path, capsys):
    other = slow_a100_profile() | {"model": "tiny-llava"}
    (tmp_path / "tiny.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit) as e:
        main(["--quick", "--profile", str(tmp_path / "tiny.json"), "--out", str(tmp_path)])
    assert e.value.code == 2 and "no workload of this suite runs tiny-llava" in capsys.readouterr().err


def test_the_gpu_packs_profile_joins_the_budget_cells(tmp_path):
    """The file the GPU measurement pack writes (benchmarks/gpu/curves.planner_profile: an H200's encoder curve, its
    LLM step skipped) is read by model and tier, runs the budget cells twice, and plans with the H200 among the tiers
    on its measured encoder."""
    from benchmarks.gpu.curves import planner_profile
    from benchmarks.planner_suite import BUDGET, WORKLOADS
    from coordinator.planner.plan_request import PlanRequest
    from coordinator.planner.planning import prepare, service_time_source

    curve = {"tokens_per_item": 576, "points": [{"batch": b, "seconds": 0.004 + 0.002 * b} for b in (1, 2, 4, 8)]}
    path = tmp_path / "profile-H200-llava-1.5-7b.json"
    path.write_text(json.dumps(planner_profile("H200", "2026-12-07", "benchmarks/gpu/run.sh on H200", curve, None)))
    measured = measured_profiles([tmp_path])["llava-1.5-7b"]
    sources = perf_sources("budget", measured)
    assert [p for p, _ in sources] == ["roofline", "measured"]
    model, modality, slo = WORKLOADS["llava-1.5-7b image 336px"]
    budget = BUDGET | {"tiers": (*BUDGET["tiers"], "H200")}
    ctx = prepare(PlanRequest(model=model, modality=modality, slo=slo, rate=2.0, profile_files=sources[1][1], **budget))
    assert any(g.tier == "H200" for a in ctx.allocations for g in a.groups)
    assert service_time_source(ctx.perf, "H200").startswith("measured: benchmarks/gpu/run.sh on H200")
    assert service_time_source(ctx.perf, "A100") == "roofline"
