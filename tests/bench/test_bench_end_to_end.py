"""`tierserve bench` end to end: against a small live cluster (two presets, two rates, a few requests
each) and against the planner's simulator for a plan file from `tierserve plan`."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import httpx
import pytest

from benchmarks.bench.plots import main as plots_main
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port


@pytest.fixture(scope="module")
def small_cluster(redis_url, tmp_path_factory):
    spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], redis_url=redis_url,
                       key_prefix=f"tstest-{uuid.uuid4().hex[:10]}", port=free_port())
    with LocalCluster(spec, tmp_path_factory.mktemp("bench-logs")) as c:
        yield c


def _check_outputs(out, cells: int, per_cell: int) -> dict:
    doc = json.loads((out / "bench.json").read_text())
    assert doc["command"].startswith("python -m benchmarks.bench ") and doc["git_revision"] and doc["seed"] == 0
    assert len(doc["cells"]) == cells
    for cell in doc["cells"]:
        s = cell["summary"]
        assert s["requests"] == s["completed"] == per_cell and s["errors"] == {}
        assert 0 < s["goodput_rps"] <= s["throughput_rps"] and s["slo_attainment"] == 1.0
        assert s["cost_per_hour"] > 0 and s["cost_per_1k_good"] > 0 and s["cost_per_1m_output_tokens"] > 0
        for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
            assert s[key]["p50"] > 0
        for r in cell["requests"]:
            assert r["ok"] and r["good"] and 0 < r["ttft_s"] <= r["e2e_s"] and r["output_tokens"] == 4
            assert r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / 3, abs=2e-6)
            assert r["request"]["max_tokens"] == 4 and r["request"]["modality"] == "image"
    for png in ("goodput_vs_rate.png", "latency_cdf.png", "cost_per_goodput.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "table.txt").read_text().startswith("$ python -m benchmarks.bench ")
    assert plots_main([str(out / "bench.json"), "--out", str(out / "redrawn")]) == 0  # plots from the JSON alone
    assert (out / "redrawn" / "cost_per_goodput.png").is_file()
    return doc


@pytest.mark.slow
@pytest.mark.redis
def test_bench_against_a_live_cluster(small_cluster, tmp_path):
    url = small_cluster.url
    before = httpx.get(f"{url}/v1/admin/policy", timeout=10).json()
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench", "--target", url, "--preset", "passthrough-epd,current",
                        "--sweep-rate", "4,8", "--num-requests", "3", "--output-tokens", "4", "--warmup", "1",
                        "--goodput", "ttft:20000", "tpot:5000", "--gpus", "1xRTX4090,1xA100", "--out", str(tmp_path),
                        "--quiet"], check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    doc = _check_outputs(tmp_path, cells=4, per_cell=3)
    assert [c["system"] for c in doc["cells"]] == ["passthrough-epd"] * 2 + ["current"] * 2
    assert [c["rate"] for c in doc["cells"]] == [4.0, 8.0, 4.0, 8.0]
    assert doc["systems"][0]["policy"]["batch"] == {"name": "pass_through"}
    assert doc["cells"][2]["summary"]["policy"] == before  # `current` = the policy found, not the last preset's
    # the same requests at the same offsets for every system
    a, b = doc["cells"][0]["requests"], doc["cells"][2]["requests"]
    assert [x["scheduled_s"] for x in a] == [x["scheduled_s"] for x in b]
    assert httpx.get(f"{url}/v1/admin/policy", timeout=10).json() == before  # restored after the run


@pytest.mark.slow
def test_bench_on_the_simulator_for_a_plan_file(tmp_path):
    pytest.importorskip("coordinator.planner.planfile", reason="the plan-file reader is not in this checkout")
    plan = tmp_path / "plan.yaml"
    p = subprocess.run([sys.executable, "-m", "coordinator.cli", "plan", "--rate", "2", "--slo", "ttft=2s,tpot=100ms",
                        "--gpus", "1xRTX4090,1xA100", "--model", "llava-1.5-7b", "--trials", "2", "--requests", "20",
                        "--predict-requests", "40", "--out", str(plan)],
                       check=False, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench", "--target", f"sim:{plan}", "--preset",
                        "current,tierserve", "--sweep-rate", "1,4", "--num-requests", "30", "--output-tokens", "4",
                        "--goodput", "ttft:20000", "tpot:5000", "--out", str(tmp_path), "--quiet"],
                       check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert len(doc["cells"]) == 4 and all(c["summary"]["simulated"] for c in doc["cells"])
    assert doc["systems"][0]["cost"]["source"].startswith(f"plan {plan}")  # priced by the plan itself
    s = doc["cells"][0]["summary"]
    assert s["completed"] == 30 and s["goodput_rps"] > 0 and s["cost_per_1k_good"] > 0
