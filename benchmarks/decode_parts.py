"""Where a live decode phase's time goes, from a sim_fidelity layouts JSON whose records carry decode_s and marks.

Per request handed to a decode worker (its TPOT = (e2e - ttft) / (n - 1)), split into:
  handoff   first_token -> decode_admitted (export, transfer, intake), per token
  steps     decode_s: the wall time of the engine steps it was in (the worker's step timer), per token
  between   decode_admitted -> finished less decode_s: the worker's loop between steps, per token
  out       the rest of e2e - ttft: the last token's way out to the client, per token
and the steps that had to rebuild the padded decode cache (llm_node/kv.py DecodeBatches at d8ee3b0): its
own first step and each step right after another request joined or left the worker (events closer than
one step apart counted once). Times are the coordinator's marks, seconds since it received the request;
the request's send time puts them on one clock (the client -> coordinator delay taken as constant).

    python -m benchmarks.decode_parts benchmarks/results/sim_fidelity_layouts.epd-new-engine.json
"""

from __future__ import annotations

import argparse
import json
import statistics


def request_parts(records: dict) -> list[dict]:
    out = []
    for i, marks in enumerate(records.get("marks") or []):
        n, decode_s = records["output_tokens"][i], records["decode_s"][i]
        if records["error"][i] or n < 2 or decode_s is None or not {"first_token", "decode_admitted", "finished"} <= marks.keys():
            continue
        t0 = records["sent"][i]
        tpot = (records["e2e"][i] - records["ttft"][i]) / (n - 1)
        handoff = marks["decode_admitted"] - marks["first_token"]
        between = marks["finished"] - marks["decode_admitted"] - decode_s
        out.append({"n": n, "tpot": tpot, "handoff": handoff / (n - 1), "steps": decode_s / (n - 1),
                    "between": between / (n - 1), "out": tpot - (handoff + decode_s + between) / (n - 1),
                    "join": t0 + marks["decode_admitted"], "leave": t0 + marks["finished"]})
    return out


def rebuilds(parts: list[dict], step_s: float) -> None:
    """Add each request's rebuild steps and its decode neighbours' mean count."""
    events = sorted([p["join"] for p in parts] + [p["leave"] for p in parts])
    for p in parts:
        inside = [t for t in events if p["join"] < t < p["leave"] and t not in (p["join"], p["leave"])]
        distinct = sum(1 for j, t in enumerate(inside) if j == 0 or t - inside[j - 1] > step_s)
        p["rebuilds"] = 1 + distinct
        life = p["leave"] - p["join"]
        p["neighbours"] = sum(max(0.0, min(p["leave"], q["leave"]) - max(p["join"], q["join"]))
                              for q in parts if q is not p) / life if life > 0 else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result")
    ap.add_argument("--layout", default="epd")
    args = ap.parse_args(argv)
    doc = json.load(open(args.result))
    layout = next(x for x in doc["layouts"] if x["layout"] == args.layout)
    ms = lambda xs: round(1e3 * statistics.mean(xs), 3)  # noqa: E731
    print("rate  run  reqs  tpot  = handoff + steps + between + out (ms/token)  neighbours  rebuilds/steps")
    for cell in layout["cells"]:
        for k, run in enumerate(cell["live_runs"]):
            parts = request_parts(run["records"])
            if not parts:
                continue
            rebuilds(parts, statistics.median(p["steps"] for p in parts))
            share = sum(p["rebuilds"] for p in parts) / sum(p["n"] - 1 for p in parts)
            print(f"{cell['rate']:4}  {k}  {len(parts):4}  {ms([p['tpot'] for p in parts])} = "
                  f"{ms([p['handoff'] for p in parts])} + {ms([p['steps'] for p in parts])} + "
                  f"{ms([p['between'] for p in parts])} + {ms([p['out'] for p in parts])}  "
                  f"{statistics.mean(p['neighbours'] for p in parts):.2f}  {share:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
