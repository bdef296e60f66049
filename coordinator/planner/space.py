"""Stage 2's search space: for each allocation, the run-time knobs a trial may set.

The knobs are EAServe's (B, s, SM split) plus tierserve's work stealing:
- B in [1, b_max]: the adaptive micro-batching cap (B = 1 is pass-through);
- s in [s_low, s_high]: the share of prefills kept on the encode GPU's local worker (only with E+P GPUs
  AND a remote P or P+D GPU; with E+P GPUs alone every prefill is local, s = 1);
- split: how an E+P GPU's TPCs are shared per micro-batch: dynamic, a static share for the encoder,
  or none (E+P GPUs only);
- stealing on/off (only where an E GPU can also hold the LLM's weights).
A knob that the allocation cannot use is absent from its space, so no trial is spent on it.

HAS (has.py) searches the ranges stage 1 seeded (b_max = ceil(Lambda / n_E), s* +- 0.2); the baselines
(search.py) search the same knobs over the unpruned ranges. Every searcher turns a point into a
`TrialConfig` and hands it to a trial backend (trials.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from coordinator.planner.allocation import Allocation, CanHost
from coordinator.policies.base import BatchPolicyConfig, OffloadConfig, PolicyConfig
from coordinator.policies.sm_partition import SMPartitionConfig
from coordinator.policies.work_stealing import WorkStealingConfig

Split = Literal["dynamic", "static-0.25", "static-0.5", "static-0.75", "none"]
SPLITS: tuple[Split, ...] = ("dynamic", "static-0.25", "static-0.5", "static-0.75", "none")
"""SM split choices: EAServe's dynamic per-micro-batch split, its static baseline at three encoder shares,
and no partitioning."""


class Knobs(BaseModel):
    """One point of a knob space."""

    model_config = ConfigDict(frozen=True)

    batch: int = Field(ge=1)
    """B: the encode micro-batch cap (1 = pass-through)."""
    s: float = Field(0.0, ge=0.0, le=1.0)
    """Offload share to the local prefill worker; 0 without E+P GPUs, 1 with E+P GPUs but no remote prefill."""
    split: Split = "dynamic"
    """SM split on E+P GPUs; irrelevant (left at dynamic) without them."""
    stealing: bool = False
    """Work stealing on E GPUs."""

    def policy(self) -> PolicyConfig:
        """The run-time knobs as the coordinator stores them (PUT /v1/admin/policy)."""
        mode, _, share = self.split.partition("-")
        partition = SMPartitionConfig(mode=mode, **({"static_encoder_fraction": float(share)} if share else {}))
        name = "adaptive" if self.batch > 1 else "pass_through"
        return PolicyConfig(batch=BatchPolicyConfig(name=name, max_batch=self.batch),
                            offload=OffloadConfig(s=self.s), partition=partition,
                            stealing=WorkStealingConfig(enabled=self.stealing))

    def label(self) -> str:
        return f"B={self.batch} s={self.s:.2f} split={self.split} steal={'on' if self.stealing else 'off'}"


class TrialConfig(BaseModel):
    """Everything one trial deploys: the layout and its knobs."""

    model_config = ConfigDict(frozen=True)

    allocation: Allocation
    """Which GPUs play which role."""
    knobs: Knobs
    """The run-time knobs."""

    def label(self) -> str:
        """Human-readable and unique: also the key trial backends memoise on."""
        return f"{self.allocation.label()} | {self.knobs.label()}"


class KnobSpace(BaseModel):
    """The knobs one allocation admits, and their ranges."""

    model_config = ConfigDict(frozen=True)

    allocation: Allocation
    """The layout these knobs apply to."""
    b_max: int = Field(ge=1)
    """Largest B tried."""
    s_range: tuple[float, float] | None = None
    """[low, high] of s; None when s is moot (no E+P GPU, or no remote prefill GPU to offload to)."""
    s_star: float | None = None
    """Stage 1's balance point for s (the seed); None when s is moot."""
    can_steal: bool = False
    """Whether stealing is a knob (an E GPU that can hold the LLM)."""

    @model_validator(mode="after")
    def _consistent(self) -> KnobSpace:
        if (self.s_range is None) == s_is_a_knob(self.allocation):
            raise ValueError(f"allocation {self.allocation.label()}: s_range={self.s_range} must be given exactly "
                             f"when the allocation has E+P GPUs and a P or P+D GPU (otherwise s is moot)")
        if self.s_range is not None and not 0 <= self.s_range[0] <= self.s_range[1] <= 1:
            raise ValueError(f"s_range={self.s_range} must satisfy 0 <= low <= high <= 1")
        return self

    @property
    def has_local(self) -> bool:
        """E+P GPUs present: the SM split is a knob."""
        return self.allocation.count("E+P") > 0

    @property
    def fixed_s(self) -> float:
        """s when it is not a knob: 1 with E+P GPUs only (every prefill stays local), else 0."""
        return 1.0 if self.has_local else 0.0

    def seed(self) -> Knobs:
        """HAS's enqueued starting point: B_max, s*, dynamic split, no stealing."""
        s = self.fixed_s if self.s_range is None else min(max(self.s_star or 0.0, self.s_range[0]), self.s_range[1])
        return Knobs(batch=self.b_max, s=s)

    def clip(self, knobs: Knobs) -> Knobs:
        """`knobs` moved into this space (a coordinate search changing allocation keeps what it can)."""
        s = self.fixed_s if self.s_range is None else min(max(knobs.s, self.s_range[0]), self.s_range[1])
        return Knobs(batch=min(max(knobs.batch, 1), self.b_max), s=s,
                     split=knobs.split if self.has_local else "dynamic", stealing=knobs.stealing and self.can_steal)

    def sample(self, rng: np.random.Generator) -> Knobs:
        """A uniformly random point."""
        s = self.fixed_s if self.s_range is None else float(rng.uniform(*self.s_range))
        return Knobs(batch=int(rng.integers(1, self.b_max + 1)), s=s,
                     split=SPLITS[int(rng.integers(len(SPLITS)))] if self.has_local else "dynamic",
                     stealing=bool(rng.integers(2)) if self.can_steal else False)

    def values(self, knob: str, points: int = 5) -> list:
        """The values a coordinate sweep tries for `knob`: every B (or `points` spread evenly), `points`
        values of s across its range, every split, both stealing settings; [] for an absent knob."""
        if knob == "batch":
            if self.b_max <= points:
                return list(range(1, self.b_max + 1))
            return sorted({round(float(x)) for x in np.linspace(1, self.b_max, points)})
        if knob == "s":
            return [] if self.s_range is None else [float(x) for x in np.linspace(*self.s_range, points)]
        if knob == "split":
            return list(SPLITS) if self.has_local else []
        if knob == "stealing":
            return [False, True] if self.can_steal else []
        raise ValueError(f"unknown knob {knob!r}; knobs are batch, s, split, stealing")


def s_is_a_knob(allocation: Allocation) -> bool:
    """s matters only when an E+P GPU may send prefills either to its local worker or to a remote one."""
    return allocation.count("E+P") > 0 and allocation.count("P", "P+D") > 0


def can_steal(allocation: Allocation, can_host: CanHost | None) -> bool:
    """Stealing needs an E GPU whose memory also holds the LLM (checked as for an E+P GPU)."""
    tiers = [tier for tier, _ in allocation.members("E")]
    return bool(tiers) and (can_host is None or any(can_host(t, "E+P") for t in tiers))


def full_space(allocation: Allocation, b_cap: int, can_host: CanHost | None) -> KnobSpace:
    """The unpruned knob space the baselines search: B in [1, b_cap], s in [0, 1]."""
    knob = s_is_a_knob(allocation)
    return KnobSpace(allocation=allocation, b_max=b_cap, s_range=(0.0, 1.0) if knob else None,
                     s_star=0.5 if knob else None, can_steal=can_steal(allocation, can_host))


def spaces_by_label(spaces: Sequence[KnobSpace]) -> dict[str, KnobSpace]:
    """Spaces keyed by allocation label; refuses duplicates (a search would weigh one layout twice)."""
    out: dict[str, KnobSpace] = {}
    for space in spaces:
        label = space.allocation.label()
        if label in out:
            raise ValueError(f"allocation {label} appears twice in the search space")
        out[label] = space
    return out
