"""The seeds' directions, reproduced in the simulator (roofline service times from the catalog), side by side.

1. heterogeneous 2x RTX 4090 + 2x A100 vs 4x A100 on LLaVA-1.5-7B: cost per goodput at each cluster's
   capacity (HeteroServe: about 40% cheaper at no latency loss; cost model 31.4%, observed 40.6%, by purchase price);
2. adaptive micro-batching vs pass-through, plus a fixed B=8 batcher (EAServe);
3. s-offload on vs off, per modality (EAServe: the gain is largest for audio, smallest for video);
4. work stealing on vs off (HeteroServe: 1.13x throughput).

"Capacity" is the highest arrival rate at which >= 95% of requests meet the SLO (bisection on Lambda; the
same workload shape at every rate); "throughput" is what a deployment completes when offered 1.5x its
capacity. Both sides of a comparison run on identical requests. All GPUs of a deployment share one host
(embeddings over PCIe, A100s over NVLink). Verdicts compare the simulator's ratio with the seeds' figure.

    python -m benchmarks.seed_directions
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from rich.console import Console

from coordinator.planner.allocation import (
    Allocation,
    enumerate_inventory,
    parse_allocation,
    parse_inventory,
)
from coordinator.planner.arch import get_arch
from coordinator.planner.capacity import CapacityConfig, capacities, host_check
from coordinator.planner.catalog import load_catalog
from coordinator.planner.deployment import Deployment
from coordinator.planner.goodput import SLO, Summary
from coordinator.planner.perf import PerfModel
from coordinator.planner.queueing import StageLoads, stage_loads
from coordinator.planner.scenarios import (
    MixConfig,
    default_workload,
    engine_limits,
    mean_shape,
)
from coordinator.planner.sim import SimResult, Simulator
from coordinator.planner.trials import allocation_nodes
from coordinator.planner.workload import Workload
from coordinator.policies.base import BatchPolicyConfig

ATTAINMENT = 0.95
PASS = BatchPolicyConfig(name="pass_through")
"""Directions 1, 3 and 4 run pass-through: their setups are LLM-bound, where direction 2 finds that batching
leaves capacity unchanged and only adds TTFT, which would blur the comparison."""


class Bench:
    """One model and workload on the simulator: deployments, runs at a rate, capacity by bisection."""

    def __init__(self, model: str, modality: str, slo: SLO, seconds: float, mix: MixConfig | None = None) -> None:
        self.catalog, self.arch = load_catalog(), get_arch(model)
        self.perf = PerfModel(self.catalog, self.arch)
        self.model, self.modality, self.slo, self.seconds, self.mix = model, modality, slo, seconds, mix
        self.shape = mean_shape(self.workload(1.0))

    def workload(self, rate: float) -> Workload:
        return default_workload(self.arch, self.modality, rate, self.mix)

    def loads(self, alloc: Allocation) -> StageLoads:
        """The queueing model's loads at 1 req/s (score = 1 / the capacity it predicts); decode batches capped
        at the engines' 32 sequences, as the simulator runs them."""
        caps = capacities(self.perf, self.catalog, self.arch, [g.tier for g in alloc.groups], self.shape,
                          CapacityConfig(max_decode_batch=32))
        return stage_loads(alloc, 1.0, caps, 0.5)

    def deployment(self, alloc: Allocation, **knobs) -> Deployment:
        llm = sorted({g.tier for g in alloc.groups if g.role != "E"})
        engine = engine_limits(self.catalog, self.arch, self.shape, llm, longest_prompt=8192)
        return Deployment(nodes=allocation_nodes(self.catalog, alloc, "node0"), engine=engine, **knobs)

    def simulate(self, dep: Deployment, rate: float) -> SimResult:
        """`seconds` of arrivals at `rate` (a fixed request count would make fast runs too short to queue up)."""
        reqs = self.workload(rate).generate(max(200, int(rate * self.seconds)), seed=0)
        sim = Simulator(dep, self.perf, kv_bytes_per_token=self.arch.kv_bytes_per_token(),
                        embedding_bytes_per_token=self.arch.embedding_bytes(1))
        return sim.run(reqs)

    def run(self, dep: Deployment, rate: float) -> Summary:
        prices = {n.tier: self.catalog.tier(n.tier).price_per_hour for n in dep.nodes}
        return self.simulate(dep, rate).summary(self.slo, dep.node_prices(prices))

    def sustains(self, dep: Deployment, rate: float) -> tuple[bool, Summary]:
        """>= 95% of the requests meet the SLO, and the queue is not growing: mean TTFT of the last quarter of
        arrivals within 5% of the TTFT SLO of the second quarter's (a slight overload passes the attainment
        test in a finite run, but its TTFT keeps climbing)."""
        res = self.simulate(dep, rate)
        summary = res.summary(self.slo)
        q = len(res.records) // 4
        second, last = res.records[q:2 * q], res.records[3 * q:]
        drift = sum(r.ttft for r in last) / len(last) - sum(r.ttft for r in second) / len(second)
        return summary.slo_attainment >= ATTAINMENT and drift < 0.05 * self.slo.ttft_s, summary

    def capacity(self, make, hi: float, lo: float = 0.1, steps: int = 10) -> tuple[float, Summary]:
        """Highest rate in [lo, hi] that `make(rate)` sustains (see `sustains`), and its summary there."""
        ok, best = self.sustains(make(lo), lo)
        if not ok:
            return 0.0, best
        if self.sustains(make(hi), hi)[0]:
            raise ValueError(f"the deployment still sustains the search's upper bound {hi:.1f} req/s; raise `hi`")
        for _ in range(steps):
            mid = math.sqrt(lo * hi)
            ok, s = self.sustains(make(mid), mid)
            if ok:
                lo, best = mid, s
            else:
                hi = mid
        return lo, best

    def setup(self) -> dict:
        return {"model": self.model, "modality": self.modality, "slo": self.slo.model_dump(),
                "arrival_seconds_per_run": self.seconds, "workload_mix": self.workload(1.0).model_dump(mode="json")["mix"]}


def adaptive(rate: float, encoders: int) -> BatchPolicyConfig:
    """EAServe's adaptive rule with HAS's B_max = ceil(Lambda / n_E), capped at EAServe's B = 8: uncapped, at
    tens of req/s a batch may wait up to A = 1 s to fill (the batching direction shows what that costs)."""
    return BatchPolicyConfig(name="adaptive", max_batch=min(8, max(1, math.ceil(rate / encoders))))


def adaptive_uncapped(rate: float, encoders: int) -> BatchPolicyConfig:
    return BatchPolicyConfig(name="adaptive", max_batch=max(1, math.ceil(rate / encoders)))


def balanced_s(loads: StageLoads) -> float:
    return loads.c_local / (loads.c_local + loads.c_remote) if loads.c_local else 0.0


def brief(s: Summary) -> dict:
    return {"goodput_rps": round(s.goodput_rps, 3), "throughput_rps": round(s.throughput_rps, 3),
            "slo_attainment": round(s.slo_attainment, 3), "ttft_p50_s": round(s.ttft_p50_s, 4),
            "ttft_p99_s": round(s.ttft_p99_s, 4), "tpot_mean_s": round(s.tpot_mean_s, 5),
            "mean_encode_batch": round(s.mean_encode_batch, 2)}


def sustained_goodput(rate: float, s: Summary) -> float:
    """Good requests per second of arrivals: the drain after the last arrival does not dilute it."""
    return rate * s.slo_attainment


def verdict(agrees: bool | None, text: str) -> str:
    return {True: "agrees", False: "disagrees", None: "partly agrees"}[agrees] + ": " + text


def hetero_vs_homo(seconds: float) -> dict:
    bench = Bench("llava-1.5-7b", "image", SLO(ttft_s=2.0, tpot_s=0.1), seconds)
    heteroserve = parse_allocation("2xRTX4090:E,2xA100:P+D", bench.catalog)
    sides = {}
    for name, inventory in (("2xRTX4090+2xA100", "2xRTX4090,2xA100"), ("4xA100", "4xA100")):
        inv = parse_inventory(inventory, bench.catalog)
        allocs = [a for a in enumerate_inventory(inv, host_check(bench.catalog, bench.arch, bench.shape))
                  if a.gpus == 4]  # HeteroServe compares whole clusters: every GPU used
        layouts = [(a, False) for a in sorted(allocs, key=lambda a: bench.loads(a).score)[:3]]  # queueing top 3
        if name.startswith("2x"):
            layouts += [(heteroserve, False), (heteroserve, True)]  # HeteroServe's own layout, stealing off/on
        tried = []
        for alloc, steal in layouts:
            s = balanced_s(bench.loads(alloc))
            rate, summary = bench.capacity(lambda r, a=alloc, s=s, st=steal: bench.deployment(
                a, batch=PASS, offload={"s": s}, stealing={"enabled": st}), hi=3 / bench.loads(alloc).score)
            tried.append((rate, alloc, s, steal, summary))
        rate, alloc, s, steal, summary = max(tried, key=lambda t: t[0])
        good = sustained_goodput(rate, summary)
        capex = sum(bench.catalog.tier(g.tier).purchase_price_usd * g.count for g in alloc.groups)
        hourly = alloc.cost_per_hour(bench.catalog)
        sides[name] = {"allocation": alloc.label(), "s": round(s, 3), "stealing": steal, "capacity_rps": round(rate, 3),
                       "sustained_goodput_rps": round(good, 3), "at_capacity": brief(summary),
                       "purchase_usd": capex, "price_per_hour": hourly, "capex_per_goodput_usd_per_rps": capex / good,
                       "hourly_cost_per_1k_good": 1000 * hourly / (good * 3600),
                       "layouts_tried": [{"allocation": a.label(), "stealing": st, "capacity_rps": round(r, 3)}
                                         for r, a, _, st, _ in tried]}
    het, hom = sides["2xRTX4090+2xA100"], sides["4xA100"]
    common = 0.8 * min(het["capacity_rps"], hom["capacity_rps"])
    for side in (het, hom):  # latency at one rate both sustain: "no latency loss"
        alloc = parse_allocation(side["allocation"], bench.catalog)
        side["at_common_rate"] = brief(bench.run(bench.deployment(
            alloc, batch=PASS, offload={"s": side["s"]},
            stealing={"enabled": side["stealing"]}), common))
    at_capacity = 1 - het["capex_per_goodput_usd_per_rps"] / hom["capex_per_goodput_usd_per_rps"]
    hourly = 1 - het["hourly_cost_per_1k_good"] / hom["hourly_cost_per_1k_good"]
    at_common = 1 - het["purchase_usd"] / hom["purchase_usd"]  # both meet the SLO there: same goodput
    ttft = het["at_common_rate"]["ttft_p50_s"] / hom["at_common_rate"]["ttft_p50_s"]
    tpot = het["at_common_rate"]["tpot_mean_s"] / hom["at_common_rate"]["tpot_mean_s"]
    both_meet = min(het["at_common_rate"]["slo_attainment"], hom["at_common_rate"]["slo_attainment"]) >= ATTAINMENT
    magnitude = 0.25 <= at_capacity <= 0.5
    text = (f"per req/s of capacity ({het['capacity_rps']:.1f} vs {hom['capacity_rps']:.1f} req/s) the heterogeneous "
            f"cluster is {at_capacity:.1%} cheaper to buy and {hourly:.1%} cheaper per hour, vs the seeds' cost-model "
            f"31.4%. At a rate both sustain ({common:.1f} req/s, both meet the SLO: {both_meet}) it serves the same "
            f"goodput for {at_common:.1%} less purchase price (1 - 38/64: an identity of the two price tags, the seeds' "
            f"observed 40.6%, not a measurement), with P50 TTFT {ttft:.2f}x and mean TPOT {tpot:.2f}x the 4xA100 "
            f"cluster's. The best 4xA100 layout ({hom['allocation']}) "
            f"puts all four A100s to language work, while the 4090s ({het['allocation']}, stealing "
            f"{'on' if het['stealing'] else 'off'}) add much less language capacity than two more A100s, so per unit "
            f"of capacity the saving shrinks. Latency stays within the SLO but is higher: requests served on a 4090 "
            f"prefill and decode on half an A100's memory bandwidth.")
    return {"setup": bench.setup(), "sides": sides, "common_rate_rps": round(common, 3),
            "saving_at_common_rate": round(at_common, 3), "capex_saving_at_capacity": round(at_capacity, 3),
            "hourly_saving_at_capacity": round(hourly, 3), "ttft_p50_ratio_at_common_rate": round(ttft, 3),
            "tpot_mean_ratio_at_common_rate": round(tpot, 3),
            "seeds": "HeteroServe: ~40% cheaper at no latency loss (cost model 31.4%, observed 40.6%; $38k vs $64k)",
            "verdict": verdict(True if (magnitude and ttft < 1.1 and tpot < 1.1) else None if at_capacity > 0 else False,
                               text)}


def batching(seconds: float) -> dict:
    """Pass-through vs adaptive (B = ceil(Lambda/n_E) and B = 8) vs a fixed B = 8 batcher, in two regimes."""
    policies = {"pass_through": lambda r, n: BatchPolicyConfig(name="pass_through"),
                "adaptive_B=min(8,ceil(L/nE))": adaptive,
                "adaptive_B=ceil(L/nE)": adaptive_uncapped,
                "fixed_B=8_timeout_50ms": lambda r, n: BatchPolicyConfig(name="fixed_timeout", max_batch=8, timeout_s=0.05)}
    regimes = {
        "llm_bound (HeteroServe layout)": (Bench("llava-1.5-7b", "image", SLO(ttft_s=2.0, tpot_s=0.1), seconds),
                                           "2xRTX4090:E,2xA100:P+D"),
        "encoder_bound (short answers)": (Bench("llava-1.5-7b", "image", SLO(ttft_s=2.0, tpot_s=0.1), seconds,
                                                MixConfig(output_mean=16, output_range=(4, 64))),
                                          "1xRTX4090:E,5xH100:P+D"),
    }
    out = {}
    for regime, (bench, spec) in regimes.items():
        alloc = parse_allocation(spec, bench.catalog)
        n_e = alloc.count("E", "E+P")
        caps = {name: bench.capacity(lambda r, f=f, b=bench, a=alloc, n=n_e: b.deployment(a, batch=f(r, n)),
                                     hi=3 / bench.loads(alloc).score) for name, f in policies.items()}
        common = 0.9 * caps["pass_through"][0]
        at = {name: brief(bench.run(bench.deployment(alloc, batch=f(common, n_e)), common)) for name, f in policies.items()}
        out[regime] = {"setup": {**bench.setup(), "allocation": alloc.label()}, "common_rate_rps": round(common, 3),
                       "capacity_rps": {k: round(v[0], 3) for k, v in caps.items()}, "at_common_rate": at,
                       "capacity_ratio_adaptive_vs_pass_through": round(
                           caps["adaptive_B=min(8,ceil(L/nE))"][0] / caps["pass_through"][0], 3)}
    enc_regime, llm_regime = out["encoder_bound (short answers)"], out["llm_bound (HeteroServe layout)"]
    enc_caps, llm_caps = enc_regime["capacity_rps"], llm_regime["capacity_rps"]
    ratio = {k: v / enc_caps["pass_through"] for k, v in enc_caps.items()}
    enc_at, llm_at = enc_regime["at_common_rate"], llm_regime["at_common_rate"]
    text = (f"encoder-bound ({enc_regime['setup']['allocation']}), capacity vs pass-through: adaptive B<=8 "
            f"{ratio['adaptive_B=min(8,ceil(L/nE))']:.2f}x, fixed B=8 {ratio['fixed_B=8_timeout_50ms']:.2f}x, adaptive "
            f"with the uncapped HAS seed B=ceil(Lambda/n_E) {ratio['adaptive_B=ceil(L/nE)']:.2f}x (its batches wait up "
            f"to A=1 s: P50 TTFT {enc_at['adaptive_B=ceil(L/nE)']['ttft_p50_s']:.2f} s); LLM-bound (HeteroServe layout): "
            f"every policy {min(llm_caps.values()) / llm_caps['pass_through']:.2f}-"
            f"{max(llm_caps.values()) / llm_caps['pass_through']:.2f}x, and adaptive only adds TTFT (P50 "
            f"{llm_at['adaptive_B=min(8,ceil(L/nE))']['ttft_p50_s']:.2f} s vs {llm_at['pass_through']['ttft_p50_s']:.2f} s). "
            f"The throughput gain where the encoder limits agrees with EAServe; the downstream flood at fixed B=8 does "
            f"not appear (mean TPOT {enc_at['fixed_B=8_timeout_50ms']['tpot_mean_s'] * 1e3:.1f} ms vs pass-through "
            f"{enc_at['pass_through']['tpot_mean_s'] * 1e3:.1f} ms): simulated engines admit a burst of prefills under "
            f"the token budget in one step. The size is far from EAServe's up-to-4.3x over Dynamo, a whole-system figure "
            f"(allocation, offload and batching); on the roofline a batch only amortises the 1 ms launch overhead and the "
            f"weight reads, so measured small-batch inefficiency (tierserve profile) would make the gain larger.")
    return {"regimes": out, "seeds": "EAServe: micro-batching raises throughput and lowers TTFT but floods "
            "downstream (TPOT up) at fixed B=8; the adaptive rule gives the best goodput (up to 4.3x vs Dynamo's "
            "pass-through, whole system)",
            "verdict": verdict(None if ratio["adaptive_B=min(8,ceil(L/nE))"] > 1.02 else False, text)}


OFFLOAD_SETUPS = {  # the planner_search models; 1 E+P + 1 P GPU, and D GPUs enough that prefill stays the
    # bottleneck even with offload doubling it (decode runs at most 32 sequences per engine, memory permitting)
    "image": ("llava-v1.6-34b", SLO(ttft_s=10.0, tpot_s=0.1), "1xA100:E+P,1xA100:P,6xA100:D"),
    "video": ("qwen2.5-vl-32b", SLO(ttft_s=5.0, tpot_s=0.1), "1xA100:E+P,1xA100:P,3xA100:D"),
    "audio": ("ultravox", SLO(ttft_s=5.0, tpot_s=0.1), "1xA100:E+P,1xA100:P,8xA100:D"),
}


def offload(seconds: float) -> dict:
    out = {}
    for modality, (model, slo, spec) in OFFLOAD_SETUPS.items():
        bench = Bench(model, modality, slo, seconds)
        alloc = parse_allocation(spec, bench.catalog)
        loads = bench.loads(alloc)
        shares = {"off (s=0)": 0.0, "balanced s*": balanced_s(loads),
                  "as stated s*": loads.c_remote / (loads.c_remote + loads.c_local),
                  **{f"s={g:.1f}": g for g in (0.2, 0.3, 0.4, 0.5, 0.6)}}
        caps = {k: bench.capacity(lambda r, s=s, b=bench, a=alloc: b.deployment(a, batch=PASS, offload={"s": s}),
                                  hi=3.0 / loads.score)[0] for k, s in shares.items()}
        best = max((k for k in caps if k != "off (s=0)"), key=caps.get)
        tier, shape = alloc.groups[0].tier, bench.shape
        encode = bench.perf.encode_s(tier, modality, 1, shape.media_tokens)
        work_share = encode / (encode + bench.perf.prefill_s(tier, shape.prompt_tokens))
        out[modality] = {"encoder_share_of_request_work": round(work_share, 4),
                         "setup": {**bench.setup(), "allocation": alloc.label()},
                         "s": {k: round(v, 3) for k, v in shares.items()},
                         "capacity_rps": {k: round(v, 3) for k, v in caps.items()}, "best_s": best,
                         "gain_on_vs_off": round(caps[best] / caps["off (s=0)"], 3),
                         "gain_at_balanced_s": round(caps["balanced s*"] / caps["off (s=0)"], 3)}
    gains = {m: out[m]["gain_on_vs_off"] for m in out}
    share = {m: out[m]["encoder_share_of_request_work"] for m in out}
    order = sorted(gains, key=gains.get, reverse=True)
    agrees = order[0] == "audio" and order[-1] == "video" and min(gains.values()) > 1
    text = (f"offload on (best s of a grid) vs off raises capacity "
            f"{', '.join(f'{m} {g:.2f}x' for m, g in gains.items())}: a gain everywhere, ranked "
            f"{' > '.join(order)}, where the seeds rank audio first (a light Whisper encoder leaves the encode GPU room "
            f"for local prefill) and video last. In the simulator the gain follows the encoder's share of one request's "
            f"work on the E+P GPU (encode / (encode + prefill) on the roofline: "
            f"{', '.join(f'{m} {v:.1%}' for m, v in share.items())}): with our workloads audio's short prefill (about "
            f"175 tokens) leaves its encoder the largest share, while a 2880-token LLaVA-v1.6 prefill dwarfs its "
            f"encoder. Balanced s* "
            f"(alpha = 0.5) undershoots the best s where the encoder is light, since the local worker gets most of the GPU.")
    return {"modalities": out, "seeds": "EAServe: gain largest for audio, smallest for video", "verdict": verdict(
        agrees if agrees or min(gains.values()) <= 1 else None, text)}


def stealing(seconds: float) -> dict:
    bench = Bench("llava-1.5-7b", "image", SLO(ttft_s=2.0, tpot_s=0.1), seconds)
    alloc = parse_allocation("2xRTX4090:E,2xA100:P+D", bench.catalog)
    make = {on: (lambda r, on=on: bench.deployment(alloc, batch=PASS, stealing={"enabled": on}))
            for on in (False, True)}
    caps = {on: bench.capacity(make[on], hi=3 / bench.loads(alloc).score)[0] for on in make}
    overload = 1.5 * caps[False]
    tput = {}
    for on, build in make.items():  # completions per second while arrivals last (the drain is left out)
        res = bench.simulate(build(overload), overload)
        end = max(r.request.arrival for r in res.records)
        tput[on] = sum(r.finish <= end for r in res.records) / end
    cap_ratio, tput_ratio = caps[True] / caps[False], tput[True] / tput[False]
    text = (f"stealing on/off: capacity {caps[True]:.2f} vs {caps[False]:.2f} req/s ({cap_ratio:.2f}x), throughput "
            f"offered {overload:.1f} req/s {tput[True]:.2f} vs {tput[False]:.2f} req/s ({tput_ratio:.2f}x), vs the seeds' "
            f"1.13x. Each 4090 runs at most max_stolen=4 requests of LLaVA-7B while its encoder idles.")
    return {"setup": {**bench.setup(), "allocation": alloc.label(), "overload_rps": round(overload, 3)},
            "capacity_rps": {"off": round(caps[False], 3), "on": round(caps[True], 3)},
            "throughput_at_overload_rps": {"off": round(tput[False], 3), "on": round(tput[True], 3)},
            "capacity_ratio": round(cap_ratio, 3), "throughput_ratio": round(tput_ratio, 3),
            "seeds": "HeteroServe: 1.13x throughput", "verdict": verdict(
                True if 1.05 <= tput_ratio <= 1.25 else None if tput_ratio > 1 else False, text)}


SETUPS = {"hetero_vs_homogeneous": "LLaVA-1.5-7B images; 2xRTX4090 + 2xA100-80GB vs 4xA100-80GB, each in its best "
                                    "layout (searched); cost per req/s of capacity",
          "adaptive_batching_vs_pass_through": "LLaVA-1.5-7B images; an encoder-bound layout and the LLM-bound "
                                               "HeteroServe layout; capacity and latency per batching policy",
          "offload_on_vs_off": "image (LLaVA-v1.6), video (Qwen2.5-VL), audio (Ultravox) on E+P GPUs; best s of a "
                               "grid vs s = 0",
          "work_stealing_on_vs_off": "LLaVA-1.5-7B images on 2xRTX4090:E + 2xA100-80GB:P+D; stealing on vs off"}


def markdown(doc: dict) -> str:
    """The results as a table a person reads: the comparison, its configuration, the seeds' claim, our verdict."""
    rows = ["| comparison | configuration | seeds | simulator (verdict and why) |", "| --- | --- | --- | --- |"]
    for name, r in doc["results"].items():
        cells = [name.replace("_", " "), SETUPS.get(name, ""), r["seeds"], r["verdict"]]
        rows.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return (f"# The seeds' directions in the simulator\n\nMade by `{doc['command']}` (service times: "
            f"{doc['service_times']}; capacity: {doc['capacity']}). Full figures in seed_directions.json.\n\n"
            + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of arrivals per simulated run")
    p.add_argument("--out", default="benchmarks/results/seed_directions.json")
    a = p.parse_args(argv)
    console = Console(width=150)
    results = {}
    for name, fn in (("hetero_vs_homogeneous", hetero_vs_homo), ("adaptive_batching_vs_pass_through", batching),
                     ("offload_on_vs_off", offload), ("work_stealing_on_vs_off", stealing)):
        with console.status(f"{name}..."):
            results[name] = fn(a.seconds)
        console.print(f"[bold]{name}[/]: {results[name]['verdict']}", highlight=False)
    doc = {"command": " ".join(["python -m benchmarks.seed_directions", *(sys.argv[1:] if argv is None else argv)]),
           "service_times": "roofline from coordinator/planner/catalog.yaml (no measured profiles)",
           "capacity": f"highest arrival rate with >= {ATTAINMENT:.0%} of requests meeting the SLO (bisection)",
           "results": results}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    table = out.with_suffix(".md")
    table.write_text(markdown(doc))
    console.print(f"wrote {out} and {table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
