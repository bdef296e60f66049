"""The plan file: written by a (small) real planning run, read back identically, and refused clearly when bad."""

from __future__ import annotations

import math

import pytest
import yaml
from plan_file_factory import small_plan

from coordinator.planner.catalog import load_catalog
from coordinator.planner.goodput import SLO
from coordinator.planner.planfile import (
    PLAN_VERSION,
    PlanFile,
    PlanFileError,
    load_plan,
)


@pytest.fixture(scope="module")
def plan() -> PlanFile:
    return small_plan()


def test_round_trip_is_exact(plan, tmp_path):
    path = plan.save(tmp_path / "sub" / "plan.yaml")
    assert path.read_text().startswith("# tierserve plan (version 1)")
    loaded = load_plan(path)
    assert loaded == plan
    assert loaded.deployment().policy == plan.policy
    assert loaded.allocation().label() == ",".join(
        f"{g.count}x{g.tier}:{g.role}" for g in plan.allocation().groups)


def test_plan_carries_nodes_knobs_slo_workload_prediction_and_search(plan):
    assert plan.version == PLAN_VERSION and plan.model == "llava-1.5-7b" and plan.modality == "image"
    assert [n.gpu_index for n in plan.nodes] == list(range(len(plan.nodes)))
    assert {n.host for n in plan.nodes} == {"node0"}
    assert plan.slo == SLO(ttft_s=2.0, tpot_s=0.1) and plan.workload.arrivals.rate == 4
    assert plan.predicted.requests == 60 and plan.predicted.cost_per_hour == pytest.approx(plan.cost_per_hour())
    assert plan.search.method == "has" and 1 <= plan.search.trials <= 4 and plan.search.stage1.kept
    dep = plan.deployment()
    assert [n.name for n in dep.nodes] == [f"node0/gpu{i}" for i in range(len(plan.nodes))]
    catalog = load_catalog()
    assert [n.tpcs for n in dep.nodes] == [catalog.tier(n.tier).tpcs for n in plan.nodes]
    plan.check_tiers(load_catalog())


def test_infinite_cost_per_goodput_survives_yaml(plan, tmp_path):
    none_good = plan.predicted.model_copy(update={"goodput_rps": 0.0, "objective": 0.0, "cost_per_goodput": math.inf})
    path = plan.model_copy(update={"predicted": none_good}).save(tmp_path / "p.yaml")
    assert math.isinf(load_plan(path).predicted.cost_per_goodput)


def _write(tmp_path, doc) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(path)


def _doc(plan, **changes):
    doc = plan.model_dump(mode="json")
    doc.update(changes)
    return doc


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(PlanFileError, match="cannot read plan file .*tierserve plan"):
        load_plan(tmp_path / "nope.yaml")
    with pytest.raises(PlanFileError, match="not valid YAML"):
        load_plan(_write(tmp_path, "nodes: [\n"))
    with pytest.raises(PlanFileError, match="must be a YAML mapping, got list"):
        load_plan(_write(tmp_path, "- 1\n- 2\n"))


@pytest.mark.parametrize("version", [None, 2, "1"])
def test_unknown_versions_are_refused(plan, tmp_path, version):
    doc = _doc(plan, version=version)
    if version is None:
        del doc["version"]
    with pytest.raises(PlanFileError, match=f"has version {version!r}; this tierserve reads version 1"):
        load_plan(_write(tmp_path, doc))


def test_field_errors_name_the_field(plan, tmp_path):
    doc = _doc(plan)
    doc["nodes"][0]["role"] = "X"
    del doc["slo"]
    with pytest.raises(PlanFileError) as err:
        load_plan(_write(tmp_path, doc))
    assert "nodes.0.role" in str(err.value) and "slo: Field required" in str(err.value)


def test_inconsistent_plans_are_refused(plan, tmp_path):
    doc = _doc(plan)
    doc["nodes"][1]["gpu_index"] = doc["nodes"][0]["gpu_index"]
    with pytest.raises(PlanFileError, match="listed twice"):
        load_plan(_write(tmp_path, doc))
    doc = _doc(plan, prices={})
    with pytest.raises(PlanFileError, match="no \\$/h for tiers"):
        load_plan(_write(tmp_path, doc))
    doc = _doc(plan)
    doc["nodes"] = [n for n in doc["nodes"] if n["role"] in ("E", "E+P")]
    with pytest.raises(PlanFileError, match="cannot serve requests"):
        load_plan(_write(tmp_path, doc))


def test_tiers_unknown_to_the_catalog_are_reported(plan):
    nodes = [n.model_copy(update={"tier": "B300"}) for n in plan.nodes]
    odd = plan.model_copy(update={"nodes": nodes, "prices": {"B300": 9.0}})
    with pytest.raises(PlanFileError, match="tiers \\['B300'\\]"):
        odd.check_tiers(load_catalog())
