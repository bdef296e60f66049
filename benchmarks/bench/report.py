"""What a run leaves behind: a live progress bar, the results table, and a JSON file that can
reproduce and re-analyse the run (exact command, git revision, seed, workload, every request's record).

Per DESIGN "Measuring", claims are ratios from one run: each cell also carries its goodput relative
to the first system at the same rate (`goodput_vs_baseline`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks.bench.client import RequestRecord
from benchmarks.bench.sweep import Cell, rate_label

REPO = Path(__file__).resolve().parents[2]


def git_revision() -> str:
    """HEAD's commit, with "+dirty" when tracked files differ from it; "unknown" outside a checkout."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], check=False, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               check=False, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


class LiveObserver:
    """A rich progress bar per cell; with quiet=True nothing is printed but warnings."""

    def __init__(self, console: Console, quiet: bool):
        self.console, self.quiet = console, quiet
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=console, disable=quiet, transient=True)
        self._task = None

    def __enter__(self) -> LiveObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def cell_started(self, label: str, total: int) -> None:
        self._task = self.progress.add_task(label, total=total)

    def request_done(self) -> None:
        if self._task is not None:
            self.progress.advance(self._task)

    def cell_finished(self, cell: Cell) -> None:
        s = cell.summary
        if not self.quiet:
            errs = ", ".join(f"{k} x{v}" for k, v in s["errors"].items())
            self.progress.console.print(f"  {cell.system} @ {rate_label(cell.rate)}: goodput {s['goodput_rps']:.3f} req/s, "
                                        f"{s['completed']}/{s['requests']} completed" + (f" ({errs})" if errs else ""))

    def note(self, message: str) -> None:
        if not self.quiet or "warning" in message:
            self.progress.console.print(message)


def add_ratios(cells: list[Cell]) -> None:
    """goodput_vs_baseline: this cell's goodput / the first system's goodput at the same rate."""
    base: dict[str, float] = {}
    for c in cells:
        key = rate_label(c.rate)
        base.setdefault(key, c.summary["goodput_rps"])
        b = base[key]
        c.summary["goodput_vs_baseline"] = round(c.summary["goodput_rps"] / b, 4) if b > 0 else None


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(cells: list[Cell], title: str) -> Table:
    """One row per cell; latencies in ms, costs in USD."""
    t = Table(title=title, title_justify="left", caption="latencies in ms; x base = goodput / first system's at that rate",
              caption_justify="left")
    cols = ("system", "rate/s", "done", "errors", "goodput/s", "x base", "SLO met", "TTFT p50", "TTFT p99",
            "TPOT p50", "TPOT p99", "tok/s", "$/1k good", "$/1M tok")
    for c in cols:
        t.add_column(c, justify="left" if c in ("system", "errors") else "right", no_wrap=c != "errors")
    for c in cells:
        s = c.summary
        errs = ", ".join(f"{k}:{v}" for k, v in s["errors"].items()) or "-"
        t.add_row(c.system, rate_label(c.rate).removesuffix(" req/s"), f"{s['completed']}/{s['requests']}", errs,
                  f"{s['goodput_rps']:.3f}", _f(s.get("goodput_vs_baseline"), "x{:.2f}"), _f(s["slo_attainment"], "{:.0%}"),
                  _f(s["ttft_ms"]["p50"]), _f(s["ttft_ms"]["p99"]), _f(s["tpot_ms"]["p50"]), _f(s["tpot_ms"]["p99"]),
                  f"{s['output_tokens_per_s']:.1f}", _f(s.get("cost_per_1k_good"), "{:.4f}"),
                  _f(s.get("cost_per_1m_output_tokens"), "{:.2f}"))
    return t


def table_text(t: Table) -> str:
    buf = Console(file=io.StringIO(), width=220, record=True, color_system=None)
    buf.print(t)
    return "\n".join(line.rstrip() for line in buf.export_text().splitlines()) + "\n"


def _rounded(v: Any) -> Any:
    """Microsecond resolution is all a client-side clock gives; more digits only grow the file."""
    if isinstance(v, float):
        return round(v, 6)
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return v


def _rate_json(rate: float) -> float | str:
    return "trace" if math.isnan(rate) else "inf" if math.isinf(rate) else rate


def results_json(cells: list[Cell], context: dict[str, Any]) -> dict[str, Any]:
    return {
        **context,
        "git_revision": git_revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                 "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        "cells": [{"system": c.system, "rate": _rate_json(c.rate), "summary": c.summary,
                   "requests": [_rounded(dataclasses.asdict(r)) for r in c.records]} for c in cells],
    }


def cells_from_json(doc: dict[str, Any]) -> list[Cell]:
    """The cells of a results file, back as objects (to redraw plots without re-running)."""
    def rate(v: float | str) -> float:
        return math.nan if v == "trace" else math.inf if v == "inf" else float(v)

    return [Cell(system=c["system"], rate=rate(c["rate"]), summary=c["summary"],
                 records=[RequestRecord(**r) for r in c["requests"]]) for c in doc["cells"]]


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
