"""The planner's pick against fixed recipes, on a suite of workloads, on the simulator (issue 17, point 1).

Workloads: LLaVA-1.5-7B with one 336 px image (576 tokens), LLaVA-NeXT (v1.6-34B) high-res images (2880
tokens), Qwen2.5-VL-7B video (8 frames), Ultravox (27B) audio. Each at a light, medium and heavy rate:
0.2, 0.5 and 0.8 of the most the inventory 2x RTX 4090 + 2x A100-80GB sustains by the queueing model
(stage 1's best score at 1 req/s), once on that inventory and once for a budget ($/h, tiers RTX 4090,
L40S, A100, H100, at most 6 GPUs).

In every cell: the planner (HAS, default search: bf16 at TP 1/2/4) against each fixed recipe in its best
layout. A recipe fixes the roles it uses and its knobs; its "best layout" is the best, on the trial
stream, of its (up to) LAYOUTS cheapest layouts that the queueing model says keep up (stage 1's model,
without the planner's 85 % headroom):
  monolithic       vLLM-like: one tier only, E + P+D GPUs (no KV hand-off), pass-through, nothing else.
                   Our roles have no E+P+D GPU; an E GPU beside P+D GPUs of the same tier is the closest.
  passthrough-epd  Dynamo-like: E, P and D GPUs (P/D disaggregated, KV hand-off), B = 1, s = 0, no stealing.
  easerve          EAServe: any roles, adaptive micro-batching B = 8, offload s = 0.3 where an E+P GPU has a
                   remote alternative, dynamic SM split, no stealing.
  heteroserve      HeteroServe: E GPUs of a cheaper tier than the P+D GPUs, pass-through, work stealing on.
The planner's pick is what `tierserve plan` writes (its top 3 trials re-run on its own prediction
stream, validation.py). Every side's pick is then simulated on an evaluation stream nobody searched on
(--eval-requests requests, seed 7); the table compares good requests per dollar there.

    python -m benchmarks.planner_suite            # the full suite (~24 cells)
    python -m benchmarks.planner_suite --quick    # one load per workload, fewer requests

With measured profiles (`--profile FILE|DIR`, e.g. the GPU measurement pack's profile-H200-llava-1.5-7b.json), every
cell of a workload whose model a profile was measured on runs twice, on the roofline figures alone and with the
measured profiles first (`tierserve plan --profile`), and the table reports both (column "perf"); a measured tier
joins the budget's tiers in both runs, and both run at the same rates (the loads above, on the roofline figures),
so they differ only in where the service times come from. An inventory
cell holding none of the measured tiers runs once (the measured figures would change nothing there).

    python -m benchmarks.planner_suite --profile out/gpu/profile-H200-llava-1.5-7b.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from coordinator.planner.allocation import Allocation
from coordinator.planner.goodput import SLO
from coordinator.planner.planning import (
    PlanContext,
    PlanError,
    PlanRequest,
    pick,
    prepare,
    search,
)
from coordinator.planner.profile import Profile
from coordinator.planner.queueing import stage_loads
from coordinator.planner.space import Knobs, TrialConfig, s_is_a_knob
from coordinator.planner.trials import TrialOutcome

WORKLOADS = {
    "llava-1.5-7b image 336px": ("llava-1.5-7b", "image", SLO(ttft_s=2.0, tpot_s=0.1)),
    "llava-next-34b image high-res": ("llava-v1.6-34b", "image", SLO(ttft_s=10.0, tpot_s=0.1)),
    "qwen2.5-vl-7b video": ("qwen2.5-vl-7b", "video", SLO(ttft_s=5.0, tpot_s=0.1)),
    "ultravox audio": ("ultravox", "audio", SLO(ttft_s=5.0, tpot_s=0.1)),
}
LOADS = {"light": 0.2, "medium": 0.5, "heavy": 0.8}
INVENTORY = "2xRTX4090,2xA100"
BUDGET = {"budget_per_hour": 12.0, "tiers": ("RTX4090", "L40S", "A100", "H100"), "max_gpus": 6}
LAYOUTS = 6
EVAL_SEED = 7


def _roles(a: Allocation) -> set[str]:
    return {g.role for g in a.groups}


def _tiers(a: Allocation, *roles: str) -> set[str]:
    return {g.tier for g in a.groups if g.role in roles}


def _cheaper_encoders(a: Allocation, ctx: PlanContext) -> bool:
    enc, llm = _tiers(a, "E"), _tiers(a, "P+D")
    price = lambda t: ctx.catalog.tier(t).price_per_hour
    return bool(enc and llm) and max(map(price, enc)) < min(map(price, llm))


Recipe = tuple[Callable[[Allocation, PlanContext], bool], Callable[[Allocation], Knobs]]
RECIPES: dict[str, Recipe] = {
    "monolithic": (lambda a, ctx: _roles(a) == {"E", "P+D"} and len({g.tier for g in a.groups}) == 1,
                   lambda a: Knobs(batch=1)),
    "passthrough-epd": (lambda a, ctx: _roles(a) == {"E", "P", "D"}, lambda a: Knobs(batch=1)),
    "easerve": (lambda a, ctx: True,
                lambda a: Knobs(batch=8, s=0.3 if s_is_a_knob(a) else (1.0 if a.count("E+P") else 0.0))),
    "heteroserve": (lambda a, ctx: _roles(a) == {"E", "P+D"} and _cheaper_encoders(a, ctx),
                    lambda a: Knobs(batch=1, stealing=True)),
}


def recipe_layouts(ctx: PlanContext, accepts: Callable[[Allocation, PlanContext], bool]) -> list[Allocation]:
    """The recipe's bf16 TP 1 layouts that the queueing model says keep up (every stage under 100 % busy:
    looser than the planner's 85 % headroom, so a recipe is never ruled out on the model's word alone),
    cheapest first."""
    req = ctx.request
    ok = [a for a in ctx.allocations if all(g.variant.is_default for g in a.groups) and accepts(a, ctx)
          and stage_loads(a, req.rate, ctx.caps, None).score < 1.0]
    ok.sort(key=lambda a: (a.cost_per_hour(ctx.catalog), stage_loads(a, req.rate, ctx.caps, None).score))
    return ok[:LAYOUTS]


def evaluate(ctx: PlanContext, config: TrialConfig, requests: int) -> TrialOutcome:
    """`config` on the evaluation stream: a seed neither the trials (+0) nor the planner's prediction (+1) used."""
    _, summary = ctx.backend.run(config, requests=requests, seed=ctx.request.workload_seed + EVAL_SEED)
    return TrialOutcome.from_summary(summary, config.allocation.cost_per_hour(ctx.catalog), "sim")


def _row(config: TrialConfig | None, outcome: TrialOutcome | None, note: str = "") -> dict:
    if config is None or outcome is None:
        return {"objective": 0.0, "config": None, "note": note}
    return {"objective": outcome.objective, "config": config.label(), "goodput_rps": outcome.goodput_rps,
            "attainment": outcome.slo_attainment, "cost_per_hour": outcome.cost_per_hour,
            "ttft_p50_s": outcome.ttft_p50_s, "tpot_mean_s": outcome.tpot_mean_s, "note": note}


def measured_profiles(paths: list[Path]) -> dict[str, dict[str, Path]]:
    """Profile files (or every *.json of a directory) by the model they were measured on, then by tier."""
    found: dict[str, dict[str, Path]] = {}
    for path in paths:
        if not path.exists():
            raise ValueError(f"no profile at {path}; the GPU measurement pack writes one (benchmarks/gpu/run.sh)")
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        if not files:
            raise ValueError(f"{path} holds no *.json profile")
        for file in files:
            try:
                profile = Profile.load(file)
            except Exception as exc:  # noqa: BLE001 - a user's file: say which one and why
                raise ValueError(f"{file} is not a profile: {exc}") from None
            found.setdefault(profile.model, {})[profile.tier] = file
    return found


def perf_sources(where: str, measured: dict[str, Path]) -> list[tuple[str, tuple[str, ...]]]:
    """(perf, profile files) to run a cell with: the roofline figures, and the measured profiles where they
    can change something (a budget cell, or an inventory holding a measured tier)."""
    sources: list[tuple[str, tuple[str, ...]]] = [("roofline", ())]
    inventory = {part.split("x", 1)[1] for part in INVENTORY.split(",")}
    if measured and (where == "budget" or inventory & set(measured)):
        sources.append(("measured", tuple(str(f) for f in measured.values())))
    return sources


def run_cell(base: dict, rate: float, trials: int, requests: int, eval_requests: int) -> dict:
    """One cell: the planner's pick and each recipe's best layout, all on the same evaluation stream."""
    req = PlanRequest(**base, rate=rate, requests_per_trial=requests)
    try:
        ctx = prepare(req)
    except PlanError as exc:
        return {"rate": rate, "error": str(exc)}
    cell: dict = {"rate": rate, "allocations": len(ctx.allocations), "systems": {}}
    best = pick(ctx, search(ctx, "has", trials=trials))[0].config
    cell["systems"]["planner"] = _row(best, evaluate(ctx, best, eval_requests),
                                      "; ".join([*ctx.notes, *best.allocation.simulated_only()]))
    for name, (accepts, knobs) in RECIPES.items():
        layouts = recipe_layouts(ctx, accepts)
        if not layouts:
            cell["systems"][name] = _row(None, None, "no layout of this recipe keeps up (queueing model)")
            continue
        configs = [TrialConfig(allocation=a, knobs=knobs(a)) for a in layouts]
        chosen = max(configs, key=lambda c: ctx.backend.evaluate(c).objective)
        cell["systems"][name] = _row(chosen, evaluate(ctx, chosen, eval_requests), f"best of {len(configs)} layouts")
    presets = [v["objective"] for k, v in cell["systems"].items() if k != "planner"]
    planner = cell["systems"]["planner"]["objective"]
    cell["best_preset"] = max(presets)
    cell["median_preset"] = statistics.median(presets)
    cell["vs_best"] = planner / cell["best_preset"] if cell["best_preset"] > 0 else None
    cell["vs_median"] = planner / cell["median_preset"] if cell["median_preset"] > 0 else None
    return cell


def capacity_rps(model: str, modality: str, slo: SLO) -> float:
    """The most req/s the inventory sustains by the queueing model: 1 / the best score at 1 req/s."""
    ctx = prepare(PlanRequest(model=model, modality=modality, rate=0.01, slo=slo, gpus=INVENTORY))
    return 1.0 / min(stage_loads(a, 1.0, ctx.caps, None).score for a in ctx.allocations)


def markdown(doc: dict) -> str:
    names = ["planner", *RECIPES]
    lines = [f"# Planner vs fixed recipes (good requests per $, simulator)\n\n`{doc['command']}`\n",
             f"| workload | where | load | perf | rate | {' | '.join(names)} | planner / best | planner's pick |",
             "|" + "---|" * (len(names) + 7)]
    for c in doc["cells"]:
        where = f"| {c['workload']} | {c['where']} | {c['load']} | {c.get('perf', 'roofline')} | {c['rate']:.2f} |"
        if "error" in c:
            lines.append(f"{where} error: {c['error']} |")
            continue
        vals = " | ".join(f"{c['systems'][n]['objective']:.0f}" for n in names)
        ratio = f"{c['vs_best']:.2f}" if c["vs_best"] is not None else "-"
        lines.append(f"{where} {vals} | {ratio} | {c['systems']['planner']['config']} |")
    for perf, s in doc["summary"].items() if "cells" not in doc["summary"] else [("roofline", doc["summary"])]:
        lines.append(f"\n{perf.capitalize()} figures: cells {s['cells']}, {s.get('compared', s['cells'])} with a recipe "
                     f"that keeps up; planner within 2% of the best recipe or better in {s['within_2pct']} of those; "
                     f"median planner / median recipe {s['median_vs_median']:.2f}x; median planner / best recipe "
                     f"{s['median_vs_best']:.2f}x; worst cell {s['worst_vs_best']:.2f}x ({s['worst_cell']}).")
    return "\n".join(lines) + "\n"


def summarize(cells: list[dict]) -> dict:
    """The table's verdict over `cells`: how many compared, within 2 % of the best recipe, the medians, the worst."""
    ok = [c for c in cells if c.get("vs_best") is not None]
    if not ok:
        raise ValueError("no cell had a recipe that keeps up; nothing to compare")
    worst = min(ok, key=lambda c: c["vs_best"])
    return {"cells": len(cells), "compared": len(ok), "within_2pct": sum(c["vs_best"] >= 0.98 for c in ok),
            "median_vs_best": statistics.median(c["vs_best"] for c in ok),
            "median_vs_median": statistics.median(c["vs_median"] for c in ok if c["vs_median"]),
            "worst_vs_best": worst["vs_best"], "worst_cell": f"{worst['workload']} {worst['where']} {worst['load']}"}


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in doc["cells"] if "error" not in c]
    names = ["planner", *RECIPES]
    fig, ax = plt.subplots(figsize=(max(8, len(cells) * 0.6), 4.5))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        ys = [c["systems"][n]["objective"] / c["best_preset"] if c["best_preset"] else 0 for c in cells]
        ax.bar([x + i * width for x in range(len(cells))], ys, width, label=n)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cells))])
    ax.set_xticklabels([f"{c['workload'].split()[0]}\n{c['where']} {c['load']}" for c in cells], fontsize=6,
                       rotation=90)
    ax.set_ylabel("good requests per $ / best recipe's")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=30, help="HAS trials per cell (default: %(default)s)")
    p.add_argument("--requests", type=int, default=100, help="requests per trial (default: %(default)s)")
    p.add_argument("--eval-requests", type=int, default=400, help="requests of the evaluation run (default: 400)")
    p.add_argument("--quick", action="store_true", help="medium load only, inventory only")
    p.add_argument("--profile", type=Path, action="append", default=[], metavar="FILE|DIR",
                   help=("measured profiles (`tierserve profile` or the GPU measurement pack's files, or a directory "
                         "of them; repeatable): the cells of their model run on the roofline figures and again "
                         "with these, side by side"))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="directory (default: %(default)s)")
    a = p.parse_args(argv)
    try:
        measured = measured_profiles(a.profile)
    except ValueError as exc:
        p.error(f"--profile: {exc}")
    unknown = sorted(set(measured) - {model for model, _, _ in WORKLOADS.values()})
    if unknown:
        p.error(f"--profile: no workload of this suite runs {', '.join(unknown)} "
                f"(its models: {', '.join(sorted({m for m, _, _ in WORKLOADS.values()}))})")
    started = time.time()
    cells = []
    for label, (model, modality, slo) in WORKLOADS.items():
        cap = capacity_rps(model, modality, slo)
        mine = measured.get(model, {})
        budget = BUDGET | {"tiers": tuple(dict.fromkeys([*BUDGET["tiers"], *mine]))}
        for where, extra in (("inventory", {"gpus": INVENTORY}), ("budget", budget)):
            if a.quick and where == "budget":
                continue
            for load, share in LOADS.items():
                if a.quick and load != "medium":
                    continue
                for perf, files in perf_sources(where, mine):
                    base = {"model": model, "modality": modality, "slo": slo, "profile_files": files, **extra}
                    cell = run_cell(base, share * cap, a.trials, a.requests, a.eval_requests)
                    cells.append({"workload": label, "where": where, "load": load, "perf": perf,
                                  "capacity_rps": cap, **cell})
                    print(json.dumps({k: cells[-1].get(k) for k in ("workload", "where", "load", "perf", "rate",
                                                                     "vs_best")}), flush=True)
    summary = {perf: summarize([c for c in cells if c["perf"] == perf])
               for perf in dict.fromkeys(c["perf"] for c in cells)}
    doc = {"command": "python -m benchmarks.planner_suite " + " ".join(argv if argv is not None else sys.argv[1:]),
           "inventory": INVENTORY, "budget": BUDGET, "loads": LOADS, "layouts_per_recipe": LAYOUTS,
           "profiles": {m: {t: str(f) for t, f in by_tier.items()} for m, by_tier in measured.items()},
           "seconds": round(time.time() - started, 1), "summary": summary, "cells": cells}
    a.out.mkdir(parents=True, exist_ok=True)
    stem = a.out / ("planner_suite_quick" if a.quick else "planner_suite")
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str))
    stem.with_suffix(".md").write_text(markdown(doc))
    plot(doc, stem.with_suffix(".png"))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
