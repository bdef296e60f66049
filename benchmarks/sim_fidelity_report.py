"""The markdown report of `sim_fidelity --layouts` (sim_fidelity_layouts.py): per layout and rate, the
live mean, the simulation, its error and the live noise floor on goodput, P50 TTFT and mean TPOT, plus
attainment, how wide the latency distributions are, and what each layout's policy did."""

from __future__ import annotations

import math

from benchmarks.sim_fidelity_layouts import METRICS, SPREAD
from coordinator.planner.ttft_stages import STAGES


def markdown(result: dict) -> str:
    lines = ["# Simulator fidelity on more layouts", "",
             (f"Command: `{result['command']}` ({result['date']}); {result['requests_per_rate']} requests per rate, "
              f"seed {result['seed']}; {result['machine']}.")]
    if result.get("resimulated"):
        lines += ["", (f"Re-judged and re-simulated offline: `{result['resimulated']['command']}` "
                       f"({result['resimulated']['date']}).")]
    lines += ["", ("Error = (sim - mean of the two live runs) / that mean; noise = |run 1 - run 2| / mean. Simulated "
                   "on each rate's own bracketing profiles; target |error| <= 10 %. Cells in **bold** miss it. "
                   "The coordinator's hops are simulated explicitly (sim_stack.py): the way in delays the request's "
                   "arrival at the encoder, the way out its first and last token; they and the rest of the "
                   "stack's measured CPU (per request at its finish, the token relay per engine step that "
                   "published tokens) run on the cluster's cores beside the workers (an E+P node's core "
                   "included), time-shared with them equally: each job whole on the core with the fewest busy "
                   "workers as it starts, moved to a freer core once one is (stack_placement 'float'); with no "
                   "freer core the live runs' per-core split of the stack's CPU (where sampled) breaks the tie, "
                   "or, with wake_affine, the core of the worker whose step woke the job. With stack_loop_share the "
                   "coordinator's part of that CPU (the layout's coordinator_share, measured CPU time by process) "
                   "runs in the hops' own queue, as the coordinator is one event loop. Each encoder's "
                   "offload router continues the line of the image requests the live cluster routed before the "
                   "run (probe, warm-up, earlier runs). "
                   "The hops' size is the profile's request_latency_s; their in/out split is the layout's "
                   "hop_in_share, from the lowest rate's live per-hop marks (these profiles predate request_in_s)."),
          "", _switches(), ""]
    lines += result.get("findings", [])
    for rep in result["layouts"]:
        lines += layout_section(rep)
    cells = [c for rep in result["layouts"] for c in rep["cells"]]
    if cells:
        tally = f"{sum(c['within_10pct'] for c in cells)} of {len(cells)} at the profiles' speed"
        if all("within_10pct_run_speed" in c for c in cells):
            tally += f", {sum(c['within_10pct_run_speed'] for c in cells)} of {len(cells)} at each run's own speed"
        if all("within_10pct_run_trace" in c for c in cells):
            tally += f", {sum(c['within_10pct_run_trace'] for c in cells)} of {len(cells)} at each run's speed over time"
        if all("within_10pct_run_noise" in c for c in cells):
            tally += f", {sum(c['within_10pct_run_noise'] for c in cells)} of {len(cells)} at each run's speed and noise"
        lines += ["", f"Cells with all three figures within 10 %: {tally}."]
    return "\n".join(lines) + "\n"


def _switches() -> str:
    """The simulator's live mechanisms as this report ran them (sim_fidelity_layouts' switches)."""
    import benchmarks.sim_fidelity_layouts as L

    on = {"stack_placement": L.STACK_PLACEMENT, "relay_per_step": L.RELAY_PER_STEP,
          "offload_routed_before": L.ROUTED_BEFORE, "wake_affine": L.WAKE_AFFINE,
          "stack_loop_share (coordinator's one event loop)": L.COORDINATOR_LOOP,
          "stack_preempts": L.STACK_PREEMPTS, "core_sharing": L.CORE_SHARING,
          "per-core sharing where measured (Layout.group_sharing)": L.GROUP_SHARING,
          "share of a time-sliced forward's stretch the run speed is read against (compute_stretched)": L.COMPUTE_STRETCHED,
          "the same for the stretch the stack's jobs caused (compute_stack_stretched)": (
              L.COMPUTE_STACK_STRETCHED if L.COMPUTE_STACK_STRETCHED is not None else "as compute_stretched"),
          "host_noise": (f"sigma {L.HOST_NOISE.sigma} per {L.HOST_NOISE.period_s * 1e3:g} ms (seed {L.HOST_NOISE.seed})"
                         if L.HOST_NOISE is not None else "off")}
    return "Simulator switches: " + ", ".join(f"{k} {v}" for k, v in on.items()) + "."


def layout_section(rep: dict) -> list[str]:
    slo = rep["slo"]
    cores = f", shared cores {rep['shared_cores_simulated']}" if rep["shared_cores_simulated"] else ""
    lines = ["", f"## {rep['layout']}: {rep['about']}", "",
             (f"Simulated as `{rep['deployment_simulated']}`, knobs `{rep['knobs']}`{cores}, "
              f"stack's CPU by core {rep.get('stack_cores_simulated')}, hop_in_share {rep.get('hop_in_share')}. "
              f"SLO: TTFT <= {slo['ttft_s'] * 1e3:g} ms and TPOT <= {slo['tpot_s'] * 1e3:g} ms."), ""]

    def loads(c: dict) -> str:
        return "; ".join(f"{r['load_average'][0][0]:.2f}-{r['load_average'][1][0]:.2f}"
                         + (f" ({r['foreign_cpu_cores']:.2f})" if "foreign_cpu_cores" in r else "") for r in c["live_runs"])

    lines += _table(rep["cells"], "sim", "error", "load avg (others' CPU, cores) per run", loads)
    if all("sim_run_speed" in c for c in rep["cells"]):
        lines += ["", ("At each live run's own speed (sim_fidelity_speed.py: the profile's encode, prefill and decode "
                       "times scaled until the simulated compute, summed as the workers report it, is the run's; the "
                       "two runs simulated apart and their figures averaged):"), ""]
        lines += _table(rep["cells"], "sim_run_speed", "error_run_speed", "speed per run (encode, prefill, decode)",
                        lambda c: "; ".join(", ".join(f"{f:.2f}" for f in r["speed"].values())
                                            for r in c["sim_run_speed"]["runs"]))
    if all("sim_run_trace" in c for c in rep["cells"]):
        lines += ["", ("At each live run's speed over time (sim_fidelity_trace.py: the run's speed per window, "
                       "read from the workers' timers window by window; the two runs simulated apart and averaged):"), ""]
        lines += _table(rep["cells"], "sim_run_trace", "error_run_trace", "decode factor per window, run 1; run 2",
                        lambda c: "; ".join(" ".join(f"{r['speed']['decode'] * f:.2f}" for f in r["trace"]["llm"])
                                            for r in c["sim_run_trace"]["runs"]))
    if all("sim_run_noise" in c for c in rep["cells"]):
        lines += ["", ("At each live run's speed and host noise (sim_fidelity_noise.py: the noise's sigma and period read "
                       "from the spread and the lag-1 autocorrelation of the requests' mean decode step, as the workers' "
                       "timers report it, with the speed read as above; the two runs simulated apart and averaged):"), ""]
        lines += _table(rep["cells"], "sim_run_noise", "error_run_noise",
                        "sigma per period, ms, run 1; run 2 (spread live / sim); draws: the figures' range over them",
                        lambda c: "; ".join(f"{r['sigma']:.2f} per {r['period_s'] * 1e3:g} "
                                            f"({r['live_step_stats'][0]:.2f} / "
                                            f"{r['sim_step_stats'][0] if r['sim_step_stats'] else math.nan:.2f})"
                                            for r in c["sim_run_noise"]["runs"]) + _draws(c))
    if all("live_spread" in c for c in rep["cells"]):
        q = "/".join(f"p{x}" for x in SPREAD)
        lines += ["", f"Spread, ms ({q}), live / sim: " + "; ".join(
            f"{c['rate']:g} req/s TTFT {_ms(c['live_spread']['ttft'])} / {_ms(c['sim']['spread']['ttft'])}, "
            f"TPOT {_ms(c['live_spread']['tpot'], 1)} / {_ms(c['sim']['spread']['tpot'], 1)}" for c in rep["cells"])]
    lines += ["", "Mean TTFT by stage, ms, live / sim: " + "; ".join(
        f"{c['rate']:g} req/s: " + ", ".join(
            f"{k} {c['live_ttft_stages'].get(k, math.nan) * 1e3:.1f}/{c['sim']['ttft_stages'].get(k, math.nan) * 1e3:.1f}"
            for k in STAGES) for c in rep["cells"])]
    if any(c["sim"]["stolen"] for c in rep["cells"]):
        lines += ["", "Requests kept by work stealing, live runs / sim: " + "; ".join(
            f"{c['rate']:g} req/s: {'+'.join(str(r.get('policy', {}).get('stolen', '?')) for r in c['live_runs'])}"
            f" / {c['sim']['stolen']}" for c in rep["cells"])]
    if any(c["live_mean"].get("mean_encode_batch") for c in rep["cells"]) and rep["knobs"]["batch"]["name"] != "pass_through":
        lines += ["", "Mean encode micro-batch, live / sim: " + "; ".join(
            f"{c['rate']:g} req/s: {c['live_mean']['mean_encode_batch']:.3f} / {c['sim']['mean_encode_batch']:.3f}"
            for c in rep["cells"])]
    pooled = "; ".join(f"{c['rate']:g} req/s " + ", ".join(_pct(c["error_pooled"][k]) for k in METRICS)
                       for c in rep["cells"])
    lines += ["", f"Errors with all of this layout's profiles pooled (goodput, P50 TTFT, mean TPOT): {pooled}"]
    if rep.get("notes"):
        lines += ["", *rep["notes"]]
    return lines


def _table(cells: list[dict], sim_key: str, error_key: str, last: str, last_cell) -> list[str]:
    """Per rate: live / simulated goodput, P50 TTFT and mean TPOT (error, noise floor), attainment, and `last`."""
    lines = [("| rate req/s | goodput/s live / sim (err, noise) | P50 TTFT ms live / sim (err, noise) | "
              f"mean TPOT ms live / sim (err, noise) | attainment live / sim | {last} |"),
             "| --- | --- | --- | --- | --- | --- |"]
    for c in cells:
        live, sim, err, noise = c["live_mean"], c[sim_key], c[error_key], c["noise_floor"]
        cols = [_cell(live, sim, err, noise, k, scale, fmt)
                for k, scale, fmt in (("goodput_rps", 1, ".2f"), ("ttft_p50_s", 1e3, ".1f"), ("tpot_mean_s", 1e3, ".2f"))]
        lines.append(f"| {c['rate']:g} | {' | '.join(cols)} | {live['slo_attainment']:.0%} / "
                     f"{sim['slo_attainment']:.0%} | {last_cell(c)} |")
    return lines


def _cell(live: dict, sim: dict, err: dict, noise: dict, k: str, scale: float, fmt: str) -> str:
    """live / sim (error, noise floor); bold where the error misses 10 %."""
    text = f"{live[k] * scale:{fmt}} / {sim[k] * scale:{fmt}} ({_pct(err[k])}, {_pct(noise[k], sign=False)})"
    return f"**{text}**" if err[k] is None or abs(err[k]) > 0.10 else text


def _draws(cell: dict) -> str:
    """How many draws of the host noise the cell's simulation averaged and its figures' range over them (as a share
    of the live mean: the simulation's own noise floor); nothing for cells judged on one draw."""
    spread = cell.get("sim_draw_spread")
    if not spread or cell["sim_run_noise"].get("draws", 1) < 2:
        return ""
    return (f"; {cell['sim_run_noise']['draws']} draws, range " +
            "/".join(_pct(spread[k], sign=False) for k in METRICS))


def _ms(xs: list[float], digits: int = 0) -> str:
    return "/".join(f"{x * 1e3:.{digits}f}" for x in xs)


def _pct(x: float | None, sign: bool = True) -> str:
    return "n/a" if x is None else (f"{x:+.1%}" if sign else f"{x:.1%}")
