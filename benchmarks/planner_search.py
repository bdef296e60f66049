"""Search efficiency on the simulator: HAS vs Random vs Coordinate search, 30-trial budget, several seeds.

The setups are modelled on EAServe's search comparison (seeds/000: Lambda = 5 req/s, 100 requests per trial,
30 trials; an 8-GPU server; LLaVA-v1.6-34B for images, Qwen2.5-VL-32B for video, Ultravox-v0.6-27B for
audio). What is ours: the GPUs are 8x A100-80GB (the seeds do not name them); unused GPUs cost nothing, so
the search also picks how many to use; the objective is good requests per dollar (DESIGN: goodput per
dollar), not raw throughput; image runs at Lambda = 2, because 2880-token LLaVA-v1.6 images at 5 req/s
exceed 8 A100s on our roofline (EAServe's own LLaVA-34B arrival experiment also used Lambda = 2); SLOs are
ours (the seeds give none): TTFT 10 s / TPOT 100 ms for the 34B image model, 5 s / 100 ms otherwise.

Methods (each with the same backend, workload stream and trial budget):
  has           stage 1 (price-ranked, top 3) + TPE seeded with (B_max, s*), s* load-balanced, stopping rules
  has_as_stated the same with s* = C_remote / (C_remote + C_local), the formula as DESIGN states it
  has_no_stop   HAS without the stopping rules (uses all 30 trials)
  random        uniform over every feasible allocation and its knobs (B <= ceil(Lambda), s in [0, 1])
  coordinate    one knob at a time from a random point over the same space as random
"Best" for the percentiles is the best objective any method found in any seed, per modality.

    python -m benchmarks.planner_search --seeds 5 --trials 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from coordinator.planner.goodput import SLO
from coordinator.planner.planning import PlanRequest, prepare, search
from coordinator.planner.stopping import StoppingConfig

SETUPS = {
    "image": {"model": "llava-v1.6-34b", "rate": 2.0, "slo": (10.0, 0.1), "gpus": "8xA100"},
    "video": {"model": "qwen2.5-vl-32b", "rate": 5.0, "slo": (5.0, 0.1), "gpus": "8xA100"},
    "audio": {"model": "ultravox", "rate": 5.0, "slo": (5.0, 0.1), "gpus": "8xA100"},
}
METHODS = ("has", "has_as_stated", "has_no_stop", "random", "coordinate")
LABELS = {"has": "HAS", "has_as_stated": "HAS (s* as stated)", "has_no_stop": "HAS (no early stop)",
          "random": "Random", "coordinate": "Coordinate"}
STYLES = {"has": ("-", 2.4), "has_as_stated": ("-.", 1.4), "has_no_stop": ("--", 1.4), "random": ("-", 1.2),
          "coordinate": ("-", 1.2)}


def run_setup(modality: str, seeds: int, trials: int, requests: int) -> dict:
    setup = SETUPS[modality]
    ttft, tpot = setup["slo"]
    base = {"model": setup["model"], "modality": modality, "rate": setup["rate"], "slo": SLO(ttft_s=ttft, tpot_s=tpot),
            "gpus": setup["gpus"], "requests_per_trial": requests}
    ctx = prepare(PlanRequest(**base))
    stated = prepare(PlanRequest(**base, s_star="as_stated"))
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    for seed in range(seeds):
        for method in METHODS:
            started = time.perf_counter()
            if method == "has_no_stop":
                result = search(ctx, "has", trials, seed, stopping=StoppingConfig(enabled=False))
            elif method == "has_as_stated":
                result = search(stated, "has", trials, seed)
            else:
                result = search(ctx, method, trials, seed)
            best = result.best(tie_tolerance=0.0)  # the search-efficiency figure is the highest objective found
            runs[method].append({"seed": seed, "trials": len(result.records), "stop_reason": result.stop_reason,
                                 "best_objective": best.outcome.objective, "best_trial": best.number,
                                 "best_config": best.config.label(), "curve": result.best_so_far(),
                                 "seconds": time.perf_counter() - started})
    reference = max(r["best_objective"] for rs in runs.values() for r in rs)
    summary = {m: summarise(rs, reference, trials) for m, rs in runs.items()}
    s1 = ctx.stage1
    return {"setup": {**setup, "slo": {"ttft_s": ttft, "tpot_s": tpot}, "requests_per_trial": requests,
                      "workload": ctx.workload.model_dump(mode="json")},
            "stage1": {"considered": s1.considered, "feasible": s1.feasible, "within_slack": s1.within_slack,
                       "kept": [c.allocation.label() for c in s1.candidates]},
            "reference_best_objective": reference, "summary": summary, "runs": runs}


def first_reaching(curve: list[float], target: float) -> int | None:
    """1-based trial at which the best-so-far first reaches `target`; None if never."""
    return next((i + 1 for i, v in enumerate(curve) if v >= target * (1 - 1e-12)), None)


def summarise(runs: list[dict], reference: float, trials: int) -> dict:
    out = {"best_mean": statistics.fmean(r["best_objective"] for r in runs),
           "best_min": min(r["best_objective"] for r in runs), "best_max": max(r["best_objective"] for r in runs),
           "best_mean_share_of_reference": statistics.fmean(r["best_objective"] for r in runs) / reference,
           "trials_used_mean": statistics.fmean(r["trials"] for r in runs)}
    for pct in (90, 99):
        hits = [first_reaching(r["curve"], pct / 100 * reference) for r in runs]
        reached = [h for h in hits if h is not None]
        out[f"p{pct}_trials"] = hits
        out[f"p{pct}_reached"] = f"{len(reached)}/{len(runs)}"
        out[f"p{pct}_median_trials"] = statistics.median(reached) if reached else None
    return out


def plot(results: dict, trials: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.2), sharey=True)
    for ax, (modality, res) in zip(axes, results.items()):
        ref = res["reference_best_objective"]
        xs = list(range(1, trials + 1))
        for method in METHODS:
            curves = [[100 * v / ref for v in r["curve"] + [r["curve"][-1]] * (trials - len(r["curve"]))]
                      for r in res["runs"][method]]
            mean = [statistics.fmean(c[i] for c in curves) for i in range(trials)]
            style, width = STYLES[method]
            line, = ax.plot(xs, mean, label=LABELS[method], linestyle=style, linewidth=width)
            ax.fill_between(xs, [min(c[i] for c in curves) for i in range(trials)],
                            [max(c[i] for c in curves) for i in range(trials)], color=line.get_color(), alpha=0.12)
        for level in (90, 99):
            ax.axhline(level, color="grey", linestyle=":", linewidth=0.8)
        s = res["setup"]
        ax.set_title(f"{modality}: {s['model']}, {s['gpus']}, Λ={s['rate']:g} req/s")
        ax.set_xlabel("trial")
        ax.set_xlim(1, trials)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("best objective so far (% of best found;\nobjective = good requests per $)")
    axes[0].set_ylim(0, 105)
    axes[0].legend(loc="center right", fontsize=8)  # the image panel has room between its curves
    fig.suptitle("Search efficiency on the simulator: mean over seeds (band: min-max); dotted: 90% and 99%; "
                 "a stopped search stays flat")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _median(trials: float | None) -> str:
    return "never" if trials is None else f"{trials:g}"


def markdown(doc: dict) -> str:
    """The printed table as markdown, with each modality's setup: what a reader of results/ needs."""
    lines = [f"# Search efficiency: HAS vs Random vs Coordinate\n\nMade by `{doc['command']}`: {doc['trials']}-trial "
             f"budget, {doc['seeds']} seeds, on the simulator; objective: {doc['objective']}; 100% = {doc['reference']}. "
             f"Plot: {Path(doc['plot']).name}; every trial in planner_search.json.\n",
             "| modality (setup) | method | best, good req/$: mean [min-max] | % of best | trials used | "
             "trials to 90% (median; seeds reaching) | trials to 99% (median; seeds reaching) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for modality, res in doc["results"].items():
        st = res["setup"]
        where = f"{modality} ({st['model']}, {st['gpus']}, {st['rate']:g} req/s)"
        for method in METHODS:
            s = res["summary"][method]
            lines.append(f"| {where} | {LABELS[method]} | {s['best_mean']:.1f} [{s['best_min']:.1f}-{s['best_max']:.1f}] | "
                         f"{100 * s['best_mean_share_of_reference']:.1f} | {s['trials_used_mean']:.1f} | "
                         f"{_median(s['p90_median_trials'])}; {s['p90_reached']} | "
                         f"{_median(s['p99_median_trials'])}; {s['p99_reached']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--requests", type=int, default=100, help="requests per trial (EAServe: 100)")
    p.add_argument("--modalities", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    p.add_argument("--out", default="benchmarks/results/planner_search.json")
    a = p.parse_args(argv)
    console = Console(width=170)
    results = {}
    for modality in a.modalities:
        with console.status(f"{modality}: {a.seeds} seeds x {len(METHODS)} methods x {a.trials} trials..."):
            results[modality] = run_setup(modality, a.seeds, a.trials, a.requests)
    table = Table(title=f"HAS vs Random vs Coordinate ({a.trials}-trial budget, {a.seeds} seeds, simulator)")
    for col in ("modality", "method", "best (good req/$) mean [min-max]", "% of best", "trials used",
                "trials to 90% (median; reached)", "trials to 99% (median; reached)"):
        table.add_column(col)
    for modality, res in results.items():
        for method in METHODS:
            s = res["summary"][method]
            table.add_row(modality, LABELS[method], f"{s['best_mean']:.1f} [{s['best_min']:.1f}-{s['best_max']:.1f}]",
                          f"{100 * s['best_mean_share_of_reference']:.1f}", f"{s['trials_used_mean']:.1f}",
                          f"{s['p90_median_trials']}; {s['p90_reached']}", f"{s['p99_median_trials']}; {s['p99_reached']}")
    console.print(table)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    plot(results, a.trials, png)
    doc = {"command": " ".join(["python -m benchmarks.planner_search", *(sys.argv[1:] if argv is None else argv)]),
           "seeds": a.seeds, "trials": a.trials, "objective": "good requests per dollar (goodput x 3600 / $/h)",
           "reference": "per modality, the best objective found by any method in any seed",
           "plot": str(png), "results": results}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    md = out.with_suffix(".md")
    md.write_text(markdown(doc))
    console.print(f"wrote {out}, {md} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
