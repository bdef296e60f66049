"""`--target sim --plan FILE`: the bench workload replayed on the planner's simulator for a plan file.

The plan file (coordinator/planner/planfile.py) gives the GPUs, their roles, the policy knobs and the
engine limits; the simulator (coordinator/planner/sim.py) runs the very policy objects the live
workers run. The requests are the bench's own, at the bench's arrival offsets, so a simulated cell
and a live cell of one run see the same workload; each request becomes a simulator request with:
  items           images per request (audio: one clip)
  tokens/item     the plan model's embedding tokens per image (fixed resolution, as LLaVA-1.5; the
                  synthetic image size does not change it), or per second of audio x --audio-seconds
  text tokens     the prompt's filler words (about one token each)
  output tokens   max_tokens (the bench sends ignore_eos, so live runs generate exactly that many)
A preset's policy is merged over the plan's. Time is simulated: a cell takes milliseconds, and its
"wall time" is simulated seconds. Records carry no inter-token latencies (the simulator times steps,
not streamed chunks). Text-only and dataset `messages` requests have no simulator equivalent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.bench.client import RequestRecord
from benchmarks.bench.cost import Cost
from benchmarks.bench.targets import TargetError
from benchmarks.bench.workload import RequestSpec


class SimTarget:
    """A loaded plan, its model and its performance model, ready to simulate cells."""

    def __init__(self, plan_path: Path, catalog_files: list[Path]):
        try:
            from coordinator.planner.arch import get_arch
            from coordinator.planner.catalog import CatalogError, load_catalog
            from coordinator.planner.perf import PerfModel
            from coordinator.planner.planfile import PlanFileError, load_plan
        except ImportError as e:
            raise TargetError(f"--target sim needs the planner's plan-file reader, which this installation lacks ({e})") from None

        try:
            self.plan = load_plan(plan_path)
            self.catalog = load_catalog(*catalog_files)
            self.plan.check_tiers(self.catalog)
            self.arch = get_arch(self.plan.model)
        except (PlanFileError, CatalogError) as e:
            raise TargetError(f"--target sim: {e}") from None
        except KeyError as e:
            raise TargetError(f"--target sim: plan {plan_path}: {e.args[0] if e.args else e}") from None
        self.path = plan_path
        self.perf = PerfModel(self.catalog, self.arch)

    def cost(self) -> Cost:
        """The plan's own prices, used unless --cost-per-hour/--gpus price this system."""
        parts = ", ".join(f"{n.tier} ${self.plan.prices[n.tier]:g}/h" for n in self.plan.nodes)
        return Cost(per_hour=self.plan.cost_per_hour(), source=f"plan {self.path}: {parts}")

    def encode_workers(self) -> int:
        return sum(n.role in ("E", "E+P") for n in self.plan.nodes)

    def _request(self, i: int, spec: RequestSpec, arrival: float):
        from coordinator.planner.workload import SimRequest

        modality = spec.meta.get("modality")
        if modality not in ("image", "audio"):
            raise TargetError(f"--target sim: request {spec.index} is {modality!r}; the simulator models image and "
                              "audio requests only (use --modality image or audio, without a dataset of messages)")
        try:
            if modality == "image":
                items, per_item = spec.meta.get("images", 1), int(self.arch.tokens_per_item("image"))
            else:
                items = 1
                per_item = max(1, round(self.arch.tokens_per_item("audio") * spec.meta.get("audio_s", 1.0)))
        except ValueError as e:
            raise TargetError(f"--target sim: {e}") from None
        if items < 1:
            raise TargetError(f"--target sim: request {spec.index} has no image; the simulator needs at least one item")
        words = spec.meta.get("prompt_words", 32)
        return SimRequest(i, arrival, modality, items, per_item, words, max(1, spec.max_tokens))

    def run_cell(self, specs: list[RequestSpec], offsets: list[float], policy: dict[str, Any] | None
                 ) -> tuple[list[RequestRecord], float]:
        """Simulate one cell; returns bench records (times in simulated seconds) and the wall time."""
        from pydantic import ValidationError

        from coordinator.planner.sim import Simulator
        from coordinator.policies.base import PolicyConfig

        plan = self.plan
        if policy:
            current = plan.policy.model_dump()
            try:
                merged = PolicyConfig.model_validate({k: {**v, **policy.get(k, {})} for k, v in current.items()})
            except ValidationError as e:
                raise TargetError(f"--target sim: the preset does not fit the plan's policy: {e}") from None
            plan = plan.model_copy(update={"policy": merged})
        reqs = [self._request(i, s, t) for i, (s, t) in enumerate(zip(specs, offsets))]
        sim = Simulator(plan.deployment(), self.perf, kv_bytes_per_token=self.arch.kv_bytes_per_token(),
                        embedding_bytes_per_token=self.arch.embedding_bytes(1))
        try:
            result = sim.run(reqs)
        except ValueError as e:
            raise TargetError(f"--target sim: the simulator refused the workload: {e}") from None
        records = []
        for spec, r in zip(specs, result.records):
            done = r.finish == r.finish  # NaN: never finished
            rec = RequestRecord(index=spec.index, scheduled_s=r.request.arrival, sent_s=r.request.arrival, ok=done,
                                error_type=None if done else "unfinished", request=dict(spec.meta, max_tokens=spec.max_tokens))
            if done:
                n = r.request.output_tokens
                rec.ttft_s, rec.e2e_s = r.ttft, r.finish - r.request.arrival
                rec.tpot_s = r.tpot if n > 1 else None
                rec.output_tokens, rec.prompt_tokens = n, r.request.prompt_tokens
            records.append(rec)
        wall = max((r.finish for r in result.records if r.finish == r.finish), default=0.0)
        return records, wall
