"""What a plan is asked for (`PlanRequest`) and the error when it cannot be met; planning.py solves it."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coordinator.planner.goodput import SLO
from coordinator.planner.service import Modality
from coordinator.planner.variants import VariantSpace


class PlanError(ValueError):
    """The planning problem cannot be solved as asked; the message says what to change."""


class PlanRequest(BaseModel):
    """What to plan for."""

    model_config = ConfigDict(frozen=True, protected_namespaces=())

    model: str
    """Model preset (llava-1.5-7b, ...), tiny-llava, or a LLaVA-style checkpoint directory."""
    modality: Modality | None = None
    """The workload's modality; None: the model's first (image for vision models)."""
    rate: float = Field(gt=0, allow_inf_nan=False)
    """Lambda: planned arrival rate, req/s."""
    slo: SLO
    """Latency targets goodput is judged by."""
    budget_per_hour: float | None = Field(None, gt=0)
    """Plan within this many $/h, choosing tiers from the catalog (exclusive with gpus)."""
    gpus: str | None = None
    """Plan on this inventory, e.g. "2xRTX4090,2xA100" (exclusive with budget_per_hour)."""
    tiers: tuple[str, ...] | None = None
    """Budget mode: tiers to choose from; None = every GPU tier of the catalog."""
    max_gpus: int = Field(8, ge=2)
    """Budget mode: most GPUs in one plan."""
    requests_per_trial: int = Field(100, ge=1)
    """Requests each trial replays (EAServe: 100)."""
    prediction_requests: int = Field(2000, ge=1)
    """Requests of the longer run the plan's prediction comes from."""
    max_utilisation: float = Field(0.85, gt=0, le=1)
    """Stage 1 drops layouts whose busiest stage would run above this (latency headroom); if that drops every
    layout, it plans at 100 % instead and the plan's reasons say so."""
    max_num_seqs: int = Field(32, ge=1)
    """Most sequences per LLM engine (llm_node's default 32; vLLM's is 256); memory may lower it per layout.
    Stage 1's decode capacities use the same cap, so the queueing model and the simulator agree."""
    workload_seed: int = 0
    """Seed of the trial request stream (the prediction uses the next seed: traffic the search never saw)."""
    host: str = "node0"
    """Host name written for every GPU in the plan file (edit the file for multi-host clusters)."""
    catalog_files: tuple[str, ...] = ()
    """User catalog files merged over the built-in one (extra tiers, prices)."""
    profile_files: tuple[str, ...] = ()
    """Measured profiles (`tierserve profile` files, or directories of them): their tiers' service times
    come from the measurements, the others' from the roofline; several of one tier are pooled."""
    variants: VariantSpace = VariantSpace()
    """Deployment variants the LLM workers may take (dtype, tensor parallel): bf16 at TP 1, 2 and 4 by default."""
    s_star: Literal["balanced", "as_stated"] = "balanced"
    """Centre of HAS's s window. as_stated: C_remote / (C_remote + C_local), EAServe's formula as DESIGN
    restates it (queueing.s_window). balanced: C_local / (C_remote + C_local), the local share that loads
    local and remote prefill equally. With s the LOCAL share the stated formula sends most prefills to the
    weaker side; the simulator agrees (benchmarks/planner_search.py runs both), hence the default."""

    @model_validator(mode="after")
    def _one_source(self) -> PlanRequest:
        if (self.budget_per_hour is None) == (self.gpus is None):
            raise ValueError("give exactly one of a budget ($/h) or a GPU inventory (e.g. 2xRTX4090,2xA100)")
        return self

    def digest(self) -> str:
        """Short hash of the problem: the default study name, so one storage file can hold many plans."""
        return hashlib.sha1(self.model_dump_json().encode()).hexdigest()[:10]
