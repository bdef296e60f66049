"""A short live OServe run on the local CPU cluster: `tierserve up --plan` + `tierserve replan`, under a steady
image load, until the re-planner has switched the layout once; every request is classified (nothing lost?).

    python -m benchmarks.oserve_live --rate 1 --limit-s 480

The cluster starts on an over-provisioned plan (E + P + D, three planned GPUs, for the tiny LLaVA). At a light
load the re-planner's utilisation sits under its band; after `--sustain` windows and the dwell it searches,
finds the planner's two-GPU plan at least 10 % cheaper and PUTs it; the cluster switches live (new workers
warm up out of routing, old ones drain and retire). The load keeps running through the switch and
`--after-s` beyond it. Each answer is compared with the one the same request got before (greedy decoding).
Bounded: everything stops after `--limit-s`. Writes benchmarks/results/oserve.live.json (with the command)
and oserve.live.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from benchmarks.faults.load import SteadyLoad, counts, expected_answers
from coordinator.oserve.planner_bridge import PlannerBridge
from coordinator.planner.goodput import SLO
from coordinator.planner.planfile import PlanFile
from coordinator.redis_server import free_port

OUT = Path(__file__).parent / "results"
IMAGES = [0, 1, 2, 3]


def over_provisioned(pool: str) -> PlanFile:
    """The planner's plan for 1 req/s of images, re-laid as E + P + D (one GPU per stage)."""
    plan = PlannerBridge("tiny-llava", pool, trials=4, requests_per_trial=30).plan_for("image", 1.0,
                                                                                     SLO(ttft_s=2.0, tpot_s=0.1))
    if plan is None:
        raise SystemExit(f"error: the planner found no plan for the tiny LLaVA on {pool}")
    tier = plan.nodes[0].tier
    nodes = [{"host": "node0", "gpu_index": i, "tier": tier, "role": r} for i, r in enumerate(("E", "P", "D"))]
    return PlanFile.model_validate({**plan.model_dump(mode="json"), "nodes": nodes})


def wait_ready(url: str, limit_s: float) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"error: the cluster at {url} did not become healthy within {limit_s:.0f} s")


async def load_until_switched(url: str, model: str, rate: float, after_s: float, limit_s: float) -> dict:
    expected = await expected_answers(url, model, IMAGES)
    load = SteadyLoad(url, model, expected, rate=rate)
    stop = asyncio.Event()
    task = asyncio.create_task(load.run(stop))
    t0, switched_at, last = time.monotonic(), None, None
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() - t0 < limit_s:
            await asyncio.sleep(2)
            state = (await client.get(f"{url}/v1/admin/plan")).json()
            last = state.get("switch")
            if switched_at is None and (state.get("current") or {}).get("id") not in (None, "initial"):
                switched_at = time.monotonic()
            if switched_at is not None and time.monotonic() - switched_at >= after_s:
                break
        final = (await client.get(f"{url}/v1/admin/plan")).json()
    stop.set()
    outcomes = await asyncio.wait_for(task, 180)
    return {"counts": counts(outcomes), "switched": switched_at is not None, "switch": last,
            "layout_after": (final.get("current") or {}).get("layout"), "load_s": time.monotonic() - t0,
            "not_served": [o.__dict__ for o in outcomes if o.kind != "served"][:10]}


def markdown(doc: dict) -> str:
    """The live run in a few lines: what switched, how long it took, what the load saw."""
    c, sw = doc["counts"], doc.get("switch") or {}
    lines = ["# OServe live run on the local CPU cluster", "", f"`{doc['command']}`", "",
             f"Started as {' + '.join(doc['initial_plan'])} (cluster up in {doc['cluster_up_s']:.0f} s); "
             f"`tierserve replan` switched: {sw.get('change', 'no switch')}, phase {sw.get('phase')}, "
             f"PUT -> new layout serving {sw.get('switch_s') or float('nan'):.1f} s. Layout after: "
             f"{', '.join(u['role'] + ' (' + ', '.join(u['workers']) + ')' for u in doc.get('layout_after') or [])}.",
             "", f"Load over {doc['load_s']:.0f} s: sent {c['sent']}, served {c['served']} (each the answer the same "
             f"request got before the switch), errored {c['errored']}, wrong {c['wrong']}, lost {c['lost']}.", "",
             "The re-planner's log:", "", "```", *doc["replan_log"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=1.0, help="image requests per second (default: %(default)s)")
    p.add_argument("--pool", default="3xRTX4090", help="GPUs the re-planner may use (default: %(default)s)")
    p.add_argument("--dwell-s", type=float, default=30.0, help="re-planner dwell, s (default: %(default)s)")
    p.add_argument("--sustain", type=int, default=2, help="out-of-band windows first (default: %(default)s)")
    p.add_argument("--after-s", type=float, default=30.0, help="load kept after the switch, s (default: %(default)s)")
    p.add_argument("--limit-s", type=float, default=480.0, help="the whole run's bound, s (default: %(default)s)")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--out", default=str(OUT / "oserve.live.json"))
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="oserve-live-"))
    plan = over_provisioned(a.pool)
    plan.save(work / "plan.yaml")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tierserve = [sys.executable, "-m", "coordinator.cli"]
    up = subprocess.Popen([*tierserve, "up", "--plan", str(work / "plan.yaml"), "--port", str(port),
                           "--redis-url", a.redis_url, "--key-prefix", f"oslive-{uuid.uuid4().hex[:8]}",
                           "--log-dir", str(work / "logs")], stdout=open(work / "up.log", "w"),
                          stderr=subprocess.STDOUT, start_new_session=True)
    replan = None
    t0 = time.monotonic()
    try:
        wait_ready(url, 240)
        started_s = time.monotonic() - t0
        replan = subprocess.Popen([*tierserve, "replan", "--url", url, "--pool", a.pool, "--window-s", "10",
                                   "--horizon-s", "30", "--dwell-s", str(a.dwell_s), "--sustain", str(a.sustain),
                                   "--windows", str(int(a.limit_s // 10))], stdout=open(work / "replan.log", "w"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
        result = asyncio.run(load_until_switched(url, "tiny-llava", a.rate, a.after_s,
                                                 a.limit_s - (time.monotonic() - t0)))
    finally:
        for proc in (replan, up):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
    doc = {"command": "python -m benchmarks.oserve_live " + " ".join(sys.argv[1:] if argv is None else argv),
           "initial_plan": [n.role for n in plan.nodes], "cluster_up_s": started_s, **result,
           "replan_log": (work / "replan.log").read_text().splitlines()[-40:], "work_dir": str(work)}
    Path(a.out).write_text(json.dumps(doc, indent=1, default=str))
    Path(a.out).with_suffix(".md").write_text(markdown(doc))
    print(json.dumps({k: doc[k] for k in ("counts", "switched", "switch", "layout_after", "load_s")}, indent=1,
                     default=str))
    return 0 if result["switched"] and result["counts"]["served"] == result["counts"]["sent"] else 1


if __name__ == "__main__":
    sys.exit(main())
