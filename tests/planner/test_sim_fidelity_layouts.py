"""The layouts fidelity benchmark's offline half (no cluster): every layout simulates, and a run judged
against its own simulation as if it were live comes out with no error and no noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sim_fidelity import workload
from benchmarks.sim_fidelity_layouts import LAYOUTS, judge, simulate
from benchmarks.sim_fidelity_report import markdown
from coordinator.planner.profile import Profile, pool_profiles
from tests.planner.fidelity_fakes import simulated_report

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def profile() -> Profile:
    saved = json.loads((REPO / "benchmarks/results/sim_fidelity.json").read_text())
    return pool_profiles([Profile.model_validate(c["profile"]) for c in saved["rates"]])


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_layout_simulates_and_uses_its_mechanism(name, profile):
    layout = LAYOUTS[name]
    reqs = workload(layout.rates[1], profile.encode["image"].tokens_per_item).generate(60, seed=0)
    result = simulate(layout, profile, reqs)
    assert all(r.finish > r.first_token > r.request.arrival for r in result.records)
    nodes = {(r.prefill_node, r.decode_node) for r in result.records}
    if name == "epd":
        assert nodes == {("2-P-cpu", "1-D-cpu")}  # every KV cache handed off
    if name == "colocated_prefill":
        local = sum(r.local for r in result.records)
        assert 25 <= local <= 35 and {d for _, d in nodes} == {"1-P+D-cpu", "2-D-cpu"}
    if name == "stealing":
        assert result.encoders[0].stolen > 0
    if name == "adaptive":
        assert max(r.encode_batch for r in result.records) > 1


@pytest.mark.parametrize("name", ["epd", "colocated_prefill"])
def test_a_run_judged_against_its_own_simulation_has_no_error(name, profile):
    report = simulated_report(name, profile, 40, seed=2)
    judge(report, 40, 2)
    for cell in report["cells"]:
        assert cell["error"] == {k: 0.0 for k in cell["error"]}
        assert cell["noise_floor"] == {k: 0.0 for k in cell["noise_floor"]}
        assert cell["within_10pct"]
    table = markdown({"command": "x", "date": "d", "requests_per_rate": 40, "seed": 2, "machine": "m",
                      "layouts": [report]})
    assert table.count(f"| {LAYOUTS[name].rates[1]:g} |") == 3 and "+0.0%" in table   # the profile's, the runs' speeds
    assert "3 of 3 at the profiles' speed, 3 of 3 at each run's own speed, 3 of 3 at each run's speed over time" in table


def _one_rate(tmp_path: Path, which: str) -> Path:
    """The saved epd records (benchmarks/results/sim_fidelity_layouts.at-6e6191d.epd.json) cut to their lowest or
    highest rate: the command-line tests judge one cell, not three (each re-simulation reads three ways)."""
    doc = json.loads((REPO / "benchmarks/results/sim_fidelity_layouts.at-6e6191d.epd.json").read_text())
    cells = sorted(doc["layouts"][0]["cells"], key=lambda c: c["rate"])
    doc["layouts"][0]["cells"] = [cells[0] if which == "lowest" else cells[-1]]
    path = tmp_path / f"epd-{which}.json"
    path.write_text(json.dumps(doc))
    return path


def test_host_noise_from_the_command_line_widens_the_simulated_spread(tmp_path, monkeypatch):
    """`--host-noise-sigma/--host-noise-period-ms` on a re-simulation of saved layouts records: the setting is in
    the report, the simulated TTFT spread at the lowest rate widens; one flag alone is refused."""
    import benchmarks.sim_fidelity_layouts as lay
    from benchmarks.sim_fidelity import main

    monkeypatch.setattr(lay, "HOST_NOISE", None)  # the CLI sets the module's switch: restored after the test
    monkeypatch.setattr(lay, "NOISE_DRAWS", 1)    # one draw of each run's noise reading: what is tested is the flag
    saved = _one_rate(tmp_path, "lowest")
    spreads = {}
    for tag, flags in (("off", []), ("on", ["--host-noise-sigma", "0.25", "--host-noise-period-ms", "50"])):
        out = tmp_path / f"{tag}.json"
        assert main(["--resimulate", str(saved), *flags, "--out", str(out)]) == 0
        low = min(json.loads(out.read_text())["layouts"][0]["cells"], key=lambda c: c["rate"])
        p10, _, _, p90 = low["sim"]["spread"]["ttft"]
        spreads[tag] = p90 / p10
        assert ("host_noise sigma 0.25 per 50 ms" in out.with_suffix(".md").read_text()) == (tag == "on")
    assert spreads["on"] > spreads["off"] * 1.1
    with pytest.raises(SystemExit) as e:
        main(["--resimulate", str(saved), "--host-noise-sigma", "0.25"])
    assert e.value.code == 2


def test_slos_and_core_sharing_from_the_command_line(tmp_path, monkeypatch, capsys):
    """--slo takes times with units (bare numbers once meant seconds here and are refused, with the form to use);
    --core-sharing reaches the simulator and the report's switches, and slows a layout whose workers share a core;
    --noise-draws reaches the module's switch, is refused below 1 and outside a --layouts comparison."""
    import benchmarks.sim_fidelity_layouts as lay
    from benchmarks.sim_fidelity import main

    monkeypatch.setattr(lay, "CORE_SHARING", lay.CORE_SHARING)  # the CLI sets the module's switches
    monkeypatch.setattr(lay, "GROUP_SHARING", True)
    monkeypatch.setattr(lay, "NOISE_DRAWS", 2)
    saved = _one_rate(tmp_path, "highest")
    for bad, says in ((["--slo", "epd=0.045,0.0032"], "has no unit"), (["--slo", "epd=45ms"], "expected LAYOUT=TTFT,TPOT"),
                      (["--core-sharing", "1.5"], "--core-sharing must be in (0, 1]"),
                      (["--noise-draws", "0"], "--noise-draws must be at least 1"),
                      (["--slo-ttft", "0.2"], "has no unit")):
        with pytest.raises(SystemExit) as e:
            main(["--resimulate", str(saved), *bad])
        assert e.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:   # the one-layout live comparison has no host noise to draw
        main(["--noise-draws", "2", "--rates", "1"])
    assert e.value.code == 2 and "apply to --layouts runs" in capsys.readouterr().err
    ttft = {}
    for share in ("1", "0.7"):
        out = tmp_path / f"{share}.json"
        draws = ["--noise-draws", "1"] if share == "1" else []   # one draw per noise reading for both (the test's time)
        assert main(["--resimulate", str(saved), "--slo", "epd=45ms,3.2ms", "--core-sharing", share, *draws,
                     "--out", str(out)]) == 0
        assert lay.NOISE_DRAWS == 1
        rep = json.loads(out.read_text())["layouts"][0]
        assert rep["slo"] == {"ttft_s": 0.045, "tpot_s": 0.0032}
        assert f"core_sharing {float(share)}" in out.with_suffix(".md").read_text()
        assert "per-core sharing where measured (Layout.group_sharing) False" in out.with_suffix(".md").read_text()
        ttft[share] = max(rep["cells"], key=lambda c: c["rate"])["sim"]["ttft_p50_s"]
    assert ttft["0.7"] > ttft["1"] * 1.02
