"""PNG plots of a run (matplotlib, Agg backend: no display needed).

  goodput_vs_rate.png    goodput (req/s) against offered rate, one line per system, with the offered
                         rate itself as a dotted reference (a system on it serves everything within SLO)
  latency_cdf.png        TTFT and TPOT CDFs (ms), colour = system, line style = rate, SLO marked
  cost_per_goodput.png   $ per 1k good requests, bars per system grouped by rate (only when priced)
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.bench.slo import SLO
from benchmarks.bench.sweep import Cell, rate_label

STYLES = ["-", "--", ":", "-."]


def _systems(cells: list[Cell]) -> list[str]:
    return list(dict.fromkeys(c.system for c in cells))


def _rates(cells: list[Cell]) -> list[float]:
    return list(dict.fromkeys(c.rate for c in cells))


def goodput_vs_rate(plt, cells: list[Cell], slo: SLO | None, path: Path) -> None:
    rates = _rates(cells)
    numeric = all(math.isfinite(r) for r in rates)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = rates if numeric else list(range(len(rates)))
    for i, system in enumerate(_systems(cells)):
        by = {c.rate: c.summary["goodput_rps"] for c in cells if c.system == system}
        ax.plot(xs, [by.get(r, math.nan) for r in rates], marker="o", color=f"C{i}", label=system)
    if numeric:
        ax.plot(rates, rates, ":", color="grey", label="offered rate")
        ax.set_xlabel("offered request rate (req/s)")
    else:
        ax.set_xticks(xs, [rate_label(r) for r in rates])
        ax.set_xlabel("offered request rate")
    ax.set_ylabel("goodput (SLO-meeting req/s)")
    ax.set_title("Goodput vs request rate" + (f"\nSLO: {slo.label()}" if slo else "\n(no SLO: every completed request)"))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _cdf(ax, values: list[float], **kw) -> None:
    xs = sorted(values)
    ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", **kw)


def latency_cdf(plt, cells: list[Cell], slo: SLO | None, path: Path) -> None:
    systems, rates = _systems(cells), _rates(cells)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, name, target in ((axes[0], "ttft_s", "TTFT", slo.ttft_ms if slo else None),
                                  (axes[1], "tpot_s", "TPOT", slo.tpot_ms if slo else None)):
        for c in cells:
            vals = [getattr(r, key) * 1e3 for r in c.records if r.ok and getattr(r, key) is not None]
            if vals:
                _cdf(ax, vals, color=f"C{systems.index(c.system)}", linestyle=STYLES[rates.index(c.rate) % len(STYLES)],
                     label=f"{c.system} @ {rate_label(c.rate)}")
        if target is not None:
            ax.axvline(target, color="black", linewidth=1, alpha=0.6, label="SLO target")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of completed requests")
        ax.set_title(f"{name} CDF" + (f" (SLO {target:g} ms)" if target is not None else ""))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9,
               title="system @ offered rate")  # outside the axes: many lines would hide the curves
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def cost_bars(plt, cells: list[Cell], path: Path) -> bool:
    """False (and no file) when no cell is priced."""
    if not any("cost_per_1k_good" in c.summary for c in cells):
        return False
    systems, rates = _systems(cells), _rates(cells)
    width = 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max((c.summary.get("cost_per_1k_good") or 0.0) for c in cells) or 1.0
    for i, system in enumerate(systems):
        by = {c.rate: c.summary for c in cells if c.system == system}
        xs = [j + (i - (len(systems) - 1) / 2) * width for j in range(len(rates))]
        ys = [by[r].get("cost_per_1k_good") if r in by else None for r in rates]
        ax.bar(xs, [y or 0.0 for y in ys], width, color=f"C{i}", label=system)
        for x, y, r in zip(xs, ys, rates):
            if y is None and r in by and "cost_per_1k_good" in by[r]:
                ax.text(x, top * 0.02, "no good requests", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(rates)), [rate_label(r) for r in rates])
    ax.set_xlabel("offered request rate")
    prices = {c.system: c.summary["cost_per_hour"] for c in cells if "cost_per_hour" in c.summary}
    priced = (f"every system priced at ${next(iter(prices.values())):g}/h" if len(set(prices.values())) == 1
              else ", ".join(f"{k} ${v:g}/h" for k, v in prices.items()))
    ax.set_ylabel("USD per 1,000 SLO-meeting requests")
    ax.set_title(f"Cost per goodput (lower is better)\n{priced}", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_plots(cells: list[Cell], slo: SLO | None, out_dir: Path) -> list[Path]:
    """Every plot the run supports; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "goodput_vs_rate.png", out_dir / "latency_cdf.png"]
    goodput_vs_rate(plt, cells, slo, written[0])
    latency_cdf(plt, cells, slo, written[1])
    if cost_bars(plt, cells, out_dir / "cost_per_goodput.png"):
        written.append(out_dir / "cost_per_goodput.png")
    return written


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.bench.plots bench.json [--out DIR]`: redraw a finished run's plots."""
    import argparse
    import json

    from benchmarks.bench.report import cells_from_json

    p = argparse.ArgumentParser(prog="python -m benchmarks.bench.plots", description=main.__doc__)
    p.add_argument("results", type=Path, help="a bench.json written by tierserve bench")
    p.add_argument("--out", type=Path, help="where to write the PNGs (default: beside the JSON)")
    a = p.parse_args(argv)
    try:
        doc = json.loads(a.results.read_text())
        cells = cells_from_json(doc)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {a.results} is not a tierserve bench results file ({e})")
        return 2
    slo = SLO(**doc["slo"]) if doc.get("slo") else None
    print("wrote " + ", ".join(str(f) for f in write_plots(cells, slo, a.out or a.results.parent)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
