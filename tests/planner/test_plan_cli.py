"""`tierserve plan`: the happy path writes a loadable plan; bad input exits 2 with a message, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from coordinator.cli import main
from coordinator.planner.cli import parse_duration, parse_slo
from coordinator.planner.planfile import load_plan

FAST = ["--trials", "4", "--requests", "30", "--predict-requests", "60"]
BASE = ["plan", "--rate", "4", "--slo", "ttft=2s,tpot=100ms", *FAST]


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = main([*BASE, *args])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())  # rich wraps lines at the terminal width


@pytest.mark.parametrize("text,seconds", [("2s", 2.0), ("100ms", 0.1), ("0.5", 0.5e-3), ("2000", 2.0),
                                          ("250 us", 250e-6), ("1e-1s", 0.1), ("1min", 60.0)])
def test_parse_duration(text, seconds):
    assert parse_duration(text, "ttft") == pytest.approx(seconds)


@pytest.mark.parametrize("text,match", [
    ("ttft=2parsecs,tpot=1ms", "cannot read ttft='2parsecs'"),
    ("ttft=2s", "missing: tpot"),
    ("ttft=0s,tpot=1ms", "must be a finite, positive time"),
    ("latency=2s,tpot=1ms", "unknown metric 'latency'"),
    ("ttft=1s,tpot=1ms,ttft=2s", "gives ttft twice"),
    ("", "missing: ttft, tpot"),
])
def test_parse_slo_errors(text, match):
    with pytest.raises(ValueError, match=match):
        parse_slo(text)


def test_slo_bare_numbers_are_milliseconds_as_in_bench():
    """`--slo ttft=2000` once meant 2000 s here and 2 s in `tierserve bench --goodput ttft:2000`; now both 2 s."""
    from benchmarks.bench.slo import parse_goodput

    assert parse_slo("TPOT=100ms, ttft=2s") == pytest.approx((2.0, 0.1))
    assert parse_slo("ttft=2000,tpot=100") == pytest.approx((2.0, 0.1))
    assert parse_slo("ttft:2000 ,tpot:100") == pytest.approx((2.0, 0.1))  # bench's separator reads too
    bench = parse_goodput(["ttft:2000", "tpot:100"])
    assert (bench.ttft_ms / 1e3, bench.tpot_ms / 1e3) == pytest.approx(parse_slo("ttft=2000,tpot=100"))


def test_plan_prints_the_plan_and_writes_the_file(capsys, tmp_path):
    out_file = tmp_path / "plan.yaml"
    code, out = run_cli(capsys, "--gpus", "2xRTX4090,2xA100", "--model", "llava-1.5-7b", "--out", str(out_file))
    assert code == 0, out
    for needle in ("stage 1:", "plan for llava-1.5-7b (image) at 4 req/s", "goodput", "cost per goodput",
                   f"plan written to {out_file}"):
        assert needle in out, needle
    plan = load_plan(out_file)
    assert plan.search.budget == 4 and plan.predicted.requests == 60


def test_budget_mode_and_resumed_storage(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    first = tmp_path / "a.yaml"
    code, out = run_cli(capsys, "--budget", "6", "--storage", url, "--out", str(first), "--trials", "2")
    assert code == 0, out
    assert load_plan(first).search.trials == 2
    second = tmp_path / "b.yaml"
    code, out = run_cli(capsys, "--budget", "6", "--storage", url, "--out", str(second), "--trials", "3")
    assert code == 0, out
    assert load_plan(second).search.trials == 3  # continued the stored study: 2 earlier trials + 1


@pytest.mark.parametrize("args,message", [
    (["--gpus", "2xB300,2xA100"], "error: unknown GPU tier 'B300'"),
    (["--gpus", "2xA100", "--slo", "ttft=fast,tpot=1ms"], "error: cannot read ttft='fast'"),
    (["--gpus", "2xA100", "--slo", "ttft=2parsec,tpot=1ms"], "or a number with a unit (us, ms, s, min), e.g. 2s"),
    (["--budget", "0.5", "--tiers", "L4"], "error: a budget of $0.5/h buys no complete allocation"),
    (["--budget", "1", "--rate", "8"], "error: no allocation keeps up with 8 req/s even at 100% busy"),
    (["--gpus", "2xA100", "--modality", "video"], "error: model 'llava-1.5-7b' has no video workload"),
    (["--gpus", "2xA100", "--storage", "notaurl"], "error: cannot open the study storage 'notaurl'"),
    (["--gpus", "2xA100", "--method", "random", "--storage", "sqlite:///x.db"], "resumes HAS studies only"),
    (["--gpus", "2xA100", "--trials", "0"], "error: --trials must be at least 1"),
    (["--gpus", "2xA100", "--dtypes", "int4"], "--dtypes 'int4': give a comma list of bf16, fp8, int8"),
    (["--gpus", "2xA100", "--tp", "3"], "--tp '3': tensor-parallel degrees are some of 1, 2, 4"),
])
def test_bad_input_exits_2_with_a_message(capsys, tmp_path, args, message):
    code, out = run_cli(capsys, *args, "--out", str(tmp_path / "p.yaml"))
    assert code == 2 and message in out and "Traceback" not in out, out
    assert not (tmp_path / "p.yaml").exists()


def test_console_script_exits_nonzero_without_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "coordinator.cli", *BASE, "--gpus", "3xNOPE",
                           "--out", str(tmp_path / "p.yaml")], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 2
    assert "unknown GPU tier 'NOPE'" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr


def _measured(tmp_path, name: str, scale: float, model: str = "llava-1.5-7b"):
    """A profile of the RTX 4090 for `model`, every time `scale` x a base, written to tmp_path/name."""
    from coordinator.planner.profile import Profile

    profile = Profile.model_validate(dict(
        tier="rtx4090", model=model, measured_at=f"2026-11-0{int(scale * 2)}", source=f"run {name}",
        encode={"image": {"tokens_per_item": 576, "points": [{"batch": 1, "seconds": 0.010 * scale},
                                                            {"batch": 4, "seconds": 0.025 * scale}]}},
        prefill=[{"tokens": 1000, "seconds": 0.1 * scale}, {"tokens": 2000, "seconds": 0.18 * scale}],
        decode=[{"batch": 1, "context_tokens": 1000, "seconds": 0.020 * scale},
                {"batch": 8, "context_tokens": 8000, "seconds": 0.030 * scale}]))
    return profile.save(tmp_path / name)


def test_measured_profiles_replace_the_roofline_for_their_tier_and_are_pooled(capsys, tmp_path):
    from coordinator.planner.profile import load_profiles

    for name, scale in (("a.json", 1.0), ("b.json", 3.0), ("c.json", 2.0)):
        _measured(tmp_path / "profiles", name, scale)
    pooled = load_profiles([tmp_path / "profiles"])["rtx4090"]
    assert pooled.prefill_s(1000) == pytest.approx(0.2)  # the median of 0.1, 0.3 and 0.2
    out_file = tmp_path / "plan.yaml"
    code, out = run_cli(capsys, "--gpus", "2xRTX4090,2xA100", "--model", "llava-1.5-7b", "--out", str(out_file),
                        "--profile", str(tmp_path / "profiles"))
    assert code == 0, out
    sources = load_plan(out_file).search.service_times
    assert sources["RTX4090"].startswith("measured: median of 3 profiles")
    assert sources["A100-80GB"] == "roofline"
    assert "service times (RTX4090)" in out and "measured: median of 3 profiles" in out


@pytest.mark.parametrize("make,needle", [
    (lambda d: d / "missing.json", "--profile: no profile at"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "holds no *.json profile"),
    (lambda d: _measured(d, "tiny.json", 1.0, model="tiny-llava"), "measured on model 'tiny-llava', not 'llava-1.5-7b'"),
])
def test_bad_profiles_are_refused_with_the_fix(capsys, tmp_path, make, needle):
    code, out = run_cli(capsys, "--gpus", "2xRTX4090,2xA100", "--model", "llava-1.5-7b", "--profile", str(make(tmp_path)))
    assert code == 2 and needle in out, out
    assert "Traceback" not in out


def test_a_clusters_workers_make_up_its_allocation():
    from coordinator.planner.catalog import load_catalog
    from coordinator.planner.live_plan import deployed_allocation

    workers = [{"worker_id": "encode-0", "role": "encode", "tier": "cpu"},
               {"worker_id": "llm-local-0", "role": "prefill", "tier": "cpu", "colocated_with": "encode-0"},
               {"worker_id": "encode-1", "role": "encode", "tier": "cpu"},
               {"worker_id": "llm-steal-1", "role": "combined", "tier": "cpu", "colocated_with": "encode-1"},
               {"worker_id": "llm-0", "role": "prefill", "tier": "cpu"}, {"worker_id": "llm-1", "role": "decode", "tier": "cpu"},
               {"worker_id": "llm-2", "role": "combined", "tier": "cpu"}]
    assert deployed_allocation(workers, load_catalog()).label() == "1xcpu:E,1xcpu:E+P,1xcpu:P,1xcpu:D,1xcpu:P+D"


def test_live_planning_of_an_unreachable_cluster_exits_2(capsys):
    code, out = run_cli(capsys, "--live", "http://127.0.0.1:9", "--model", "tiny-llava")
    assert code == 2 and "cannot reach http://127.0.0.1:9/v1/cluster" in out and "Traceback" not in out


@pytest.mark.slow
@pytest.mark.redis
def test_live_planning_searches_the_running_clusters_knobs_and_restores_its_policy(capsys, tmp_path, live_cluster):
    import httpx

    before = httpx.get(f"{live_cluster.url}/v1/admin/policy", timeout=10).json()
    out_file, priced = tmp_path / "live.yaml", tmp_path / "cpu-price.yaml"
    priced.write_text("tiers:\n  cpu:\n    price_per_hour: 0.5\n    price_source: test\n    price_date: '2026-11'\n")
    code = main(["plan", "--rate", "2", "--slo", "ttft=2s,tpot=200ms", "--trials", "2", "--requests", "4",
                 "--predict-requests", "20", "--model", "tiny-llava", "--live", live_cluster.url,
                 "--catalog", str(priced), "--out", str(out_file)])
    text = " ".join(capsys.readouterr().out.split())
    assert code == 0, text
    assert "runs 1xcpu:E,1xcpu:P+D" in text
    plan = load_plan(out_file)
    assert plan.search.backend == "live" and plan.search.trials == 2
    assert sorted(n.role for n in plan.nodes) == ["E", "P+D"] and plan.model == "tiny-llava"
    assert httpx.get(f"{live_cluster.url}/v1/admin/policy", timeout=10).json() == before   # put back
