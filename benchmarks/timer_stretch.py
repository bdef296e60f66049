"""How much of a core's time-slicing the workers' own compute timers see (the simulator's compute_stretched).

A live worker times its forwards with a wall clock (decode_s: the engine steps a request was in). Where two workers
time-slice one core, a step that the other worker's turn interrupts reads longer; one that the scheduler lets finish
before switching reads its own length. Which it is decides how the host's speed is read from those timers
(sim_fidelity_speed.py): a timer that saw the sharing counts it as the host being slow.

From saved live runs of colocated_prefill (`sim_fidelity --layouts` JSON), whose core 1 the combined and the decode
worker share: per request, the share of its decode during which the other worker was decoding a request too
(`overlap`: the decode worker from its `decode_admitted` mark, the combined worker from the first token), its TPOT and
its step time per token (decode_s / (tokens - 1)). Least squares on overlap give TPOT = a_t + b_t x overlap and
step = a_s + b_s x overlap; at full overlap the wall stretches by b_t / a_t and the timers by b_s / a_s, and

    seen = (b_s / a_s) / (b_t / a_t)

is the share of the stretch the timers saw. Per run, and the median over runs.

    python -m benchmarks.timer_stretch benchmarks/results/sim_fidelity_s23/quiet_phase.json \\
        benchmarks/results/sim_fidelity_s23/quiet_phase_2.json --out benchmarks/results/sim_fidelity_s25/timer_stretch.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

LAYOUT = "colocated_prefill"


def decode_spans(saved: dict[str, list]) -> list[tuple[str, float, float, float, float]]:
    """(worker, start, end, TPOT, step per token) of each finished request of a saved run with two tokens or more;
    worker "D" for a request handed off to the decode worker (its `handoff_sent` mark), else "P+D"."""
    spans = []
    for i, error in enumerate(saved["error"]):
        n, decode = saved["output_tokens"][i], saved["decode_s"][i]
        if error is not None or n < 2 or not decode:
            continue
        marks, sent = saved["marks"][i], saved["sent"][i]
        handed_off = "handoff_sent" in marks and "decode_admitted" in marks
        start = sent + (marks["decode_admitted"] if handed_off else saved["ttft"][i])
        tpot = (saved["e2e"][i] - saved["ttft"][i]) / (n - 1)
        spans.append(("D" if handed_off else "P+D", start, sent + saved["e2e"][i], tpot, decode / (n - 1)))
    return spans


def overlaps(spans: list[tuple[str, float, float, float, float]]) -> list[float]:
    """Per span: the share of it during which a span of the other worker was open."""
    out = []
    for worker, start, end, *_ in spans:
        other = sorted((s, e) for w, s, e, *_ in spans if w != worker and e > start and s < end)
        covered, cursor = 0.0, start
        for s, e in other:
            lo, hi = max(s, cursor), min(e, end)
            if hi > lo:
                covered += hi - lo
                cursor = hi
        out.append(covered / (end - start) if end > start else 0.0)
    return out


def _line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope)."""
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def run_stretch(saved: dict[str, list]) -> dict:
    """One run: the regressions and the share of the stretch its timers saw."""
    spans = decode_spans(saved)
    if len(spans) < 10:
        raise ValueError(f"{len(spans)} requests with a decode and its timer; need 10 or more")
    x = overlaps(spans)
    if max(x) < 0.5:
        raise ValueError(f"the two workers hardly decoded at once (largest overlap {max(x):.2f}); nothing to read")
    a_t, b_t = _line(x, [s[3] * 1e3 for s in spans])
    a_s, b_s = _line(x, [s[4] * 1e3 for s in spans])
    return {"requests": len(spans), "mean_overlap": round(statistics.fmean(x), 3),
            "tpot_ms": [round(a_t, 3), round(b_t, 3)], "step_ms": [round(a_s, 3), round(b_s, 3)],
            "seen": round((b_s / a_s) / (b_t / a_t), 3) if b_t > 0 else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Reads saved runs of the colocated_prefill layout (sim_fidelity --layouts JSON).")
    p.add_argument("records", type=Path, nargs="+", help="sim_fidelity --layouts result files")
    p.add_argument("--out", type=Path, help="write the result here as JSON")
    a = p.parse_args(argv)
    runs = []
    for path in a.records:
        try:
            doc = json.loads(path.read_text())
            report = next(r for r in doc["layouts"] if r["layout"] == LAYOUT)
        except (OSError, ValueError, KeyError, StopIteration) as exc:
            p.error(f"{path}: no {LAYOUT} layout in a sim_fidelity --layouts result ({exc!r})")
        for cell in report["cells"]:
            for i, run in enumerate(cell["live_runs"]):
                try:
                    runs.append({"records": str(path), "rate": cell["rate"], "run": i + 1} | run_stretch(run["records"]))
                except (KeyError, ValueError) as exc:
                    p.error(f"{path}, {cell['rate']:g} req/s, run {i + 1}: {exc}")
    seen = [r["seen"] for r in runs if r["seen"] is not None]
    result = {"command": "python -m benchmarks.timer_stretch " + " ".join(argv if argv is not None else sys.argv[1:]),
              "runs": runs, "seen_median": round(statistics.median(seen), 3) if seen else None,
              "seen_range": [min(seen), max(seen)] if seen else None}
    for r in runs:
        print(f"{Path(r['records']).stem} {r['rate']:g} req/s run {r['run']}: TPOT {r['tpot_ms'][0]:.2f} + "
              f"{r['tpot_ms'][1]:.2f} x overlap ms, step {r['step_ms'][0]:.2f} + {r['step_ms'][1]:.2f} x overlap ms; "
              f"timers saw {r['seen']}")
    print(f"median share of the stretch the timers saw: {result['seen_median']} (range {result['seen_range']})")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
