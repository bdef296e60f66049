"""What `tierserve plan` shows: a progress bar during the search, then the plan as rich tables."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from coordinator.planner.planfile import PlanFile
from coordinator.planner.search import OnTrial, TrialRecord


@contextmanager
def search_progress(console: Console, method: str, trials: int) -> Iterator[OnTrial]:
    """A progress bar over the trial budget; yields the on_trial callback that advances it.

    A search that stops early leaves the bar short of the budget, which is the point: it shows how
    much of the budget the stopping rules saved."""
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), console=console)
    task = progress.add_task(f"{method} search", total=trials, best="-")
    best = [0.0]

    def on_trial(record: TrialRecord) -> None:
        best[0] = max(best[0], record.outcome.objective)
        progress.update(task, completed=min(record.number + 1, trials), best=f"{best[0]:.0f} good req/$")

    with progress:
        yield on_trial


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def print_plan(console: Console, plan: PlanFile, path: Path) -> None:
    """The nodes, the knobs and the prediction of `plan`, and where it was written."""
    nodes = Table(title=f"plan for {plan.model} ({plan.modality}) at {plan.workload.arrivals.rate:g} req/s")
    for column in ("host", "gpu", "tier", "role", "variant", "$/h"):
        nodes.add_column(column, justify="right" if column in ("gpu", "$/h") else "left")
    for n in plan.nodes:
        variant = "" if n.role == "E" else f"{n.dtype}" + (f", tp{n.tp} from gpu{n.worker_gpu}" if n.tp > 1 else "")
        nodes.add_row(n.host, str(n.gpu_index), n.tier, n.role, variant, f"{plan.prices[n.tier]:.2f}")
    console.print(nodes)
    if plan.simulated_only:
        console.print("[yellow]simulated only:[/] the engine here cannot run this plan live: "
                      + escape("; ".join(plan.simulated_only)), highlight=False)
    for reason in plan.reasons:
        console.print("[yellow]note:[/] " + escape(reason), highlight=False)

    p = plan.policy
    knobs = Table(title="policy knobs", show_header=False)
    knobs.add_row("micro-batching", f"{p.batch.name}, B={p.batch.max_batch}")
    if any(n.role == "E+P" for n in plan.nodes):
        static = p.partition.mode == "static"
        split = p.partition.mode + (f" {p.partition.static_encoder_fraction:.2f}" if static else "")
        knobs.add_row("offload share s", f"{p.offload.s:.2f}")
        knobs.add_row("SM split", split)
    knobs.add_row("work stealing", "on" if p.stealing.enabled else "off")
    knobs.add_row("engine", f"max_num_seqs={plan.engine.max_num_seqs}, "
                            f"max_num_batched_tokens={plan.engine.max_num_batched_tokens}")
    console.print(knobs)

    o = plan.predicted
    pred = Table(title=f"predicted ({o.backend}, {o.requests} requests; SLO ttft<={_seconds(plan.slo.ttft_s)}, "
                       f"tpot<={_seconds(plan.slo.tpot_s)})", show_header=False)
    pred.add_row("goodput", f"{o.goodput_rps:.2f} req/s ({o.slo_attainment:.1%} of requests meet the SLO)")
    pred.add_row("TTFT p50 / p99", f"{_seconds(o.ttft_p50_s)} / {_seconds(o.ttft_p99_s)}")
    pred.add_row("TPOT mean / p99", f"{_seconds(o.tpot_mean_s)} / {_seconds(o.tpot_p99_s)}")
    pred.add_row("cost", f"${o.cost_per_hour:.2f}/h")
    for tier, source in plan.search.service_times.items():
        pred.add_row(f"service times ({tier})", source)
    cpg = ("inf (nothing met the SLO)" if o.goodput_rps == 0
           else f"${o.cost_per_goodput * 1000:.4f} per 1k good requests")
    pred.add_row("cost per goodput", cpg)
    console.print(pred)
    s = plan.search
    stop = f"stopped early: {s.stop_reason}" if s.stop_reason else "used the whole budget"
    console.print(f"{s.method}: {s.trials}/{s.budget} trials, best was trial {s.best_trial} ({stop}); "
                  f"plan written to [bold]{path}[/]", highlight=False)
