"""A deployment: which GPU of which tier plays which role, and the knobs its policies run with.

This is what the planner searches over and the simulator runs; the plan file (DESIGN "Contracts")
stores the same things. Roles:

- E: an encode worker alone on its GPU (it may steal language work when stealing is enabled);
- E+P: an encode worker plus its co-located prefill worker, sharing the GPU's SMs (the offload share s
  of its prefills runs there); the prefill worker hands KV caches to a D node like any P node;
- P: a prefill worker; hands each KV cache to a D node;
- D: a decode worker; takes KV caches from P and E+P nodes;
- P+D: a combined worker (prefill and decode on one GPU, no KV transfer).

A decode worker only imports KV caches and a combined one never does (llm_node/engine.py), so every
P or E+P node needs a D node to hand off to, and a D node is useless without one.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coordinator.policies.base import BatchPolicyConfig, OffloadConfig, PolicyConfig
from coordinator.policies.sm_partition import SMPartitionConfig
from coordinator.policies.work_stealing import WorkStealingConfig
from coordinator.protocol.roles import NodeRole as Role

ENCODE_ROLES = frozenset({"E", "E+P"})
PREFILL_ROLES = frozenset({"E+P", "P", "P+D"})
DECODE_ROLES = frozenset({"D", "P+D"})
REMOTE_PREFILL_ROLES = frozenset({"P", "P+D"})
"""Where an encode worker sends the prefills it does not keep local (never another encoder's local worker)."""
HANDOFF_ROLES = frozenset({"E+P", "P"})
"""Prefill-only workers: they hand every KV cache to a D node."""


class GPUNode(BaseModel):
    """One GPU and the role it plays."""

    model_config = ConfigDict(frozen=True)
    tier: str = Field(min_length=1)
    """Catalog tier name (e.g. "rtx4090", "a100-80gb"); passed as is to ServiceTimes."""
    role: Role
    """E, E+P, P, D or P+D (see the module docstring)."""
    host: str | None = None
    """Host the GPU sits in; transfers between nodes of one host use PCIe/NVLink. None: a host of its own."""
    name: str | None = None
    """Unique id in results; None: "<index>-<role>-<tier>"."""
    tpcs: int | None = Field(None, ge=1)
    """TPCs (SMs / 2) for SM partitioning on an E+P node; None: the simulator's default."""


class EngineLimits(BaseModel):
    """The LLM engines' batching limits (llm_node EngineConfig), the same on every LLM worker."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["reference", "vllm"] = "reference"
    """Which engine the LLM workers run (`python -m llm_node --engine`): tierserve's reference engine or vLLM's."""
    max_num_seqs: int = Field(32, ge=1)
    """Most sequences running in one engine at once."""
    max_num_batched_tokens: int = Field(8192, ge=1)
    """Most tokens in one step (prompt tokens of its prefills + one per decode); there is no chunked
    prefill, so every prompt (text + embeddings) must fit."""
    pad_to_longest: bool = False
    """The engine pads each batched forward to its longest sequence, as llm_node's reference engine
    does (prefill right-pads the prompts, decode left-pads the KV caches): the simulator times a step
    at batch x the longest prompt / context instead of the total (sim_engine.py). False: a paged
    engine, whose cost follows the total tokens."""

    @model_validator(mode="after")
    def _room_for_every_sequence(self) -> EngineLimits:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= "
                             f"max_num_seqs={self.max_num_seqs}")
        return self


class Deployment(BaseModel):
    """GPU nodes plus policy knobs; validated so that every request has a path E -> P -> D."""

    model_config = ConfigDict(frozen=True)
    nodes: list[GPUNode] = Field(min_length=1)
    """The GPUs, in a fixed order (it breaks routing ties)."""
    batch: BatchPolicyConfig = BatchPolicyConfig()
    """Encode micro-batching policy (one policy object per encode node)."""
    offload: OffloadConfig = OffloadConfig()
    """s: share of an E+P node's prefills kept on its own GPU."""
    partition: SMPartitionConfig = SMPartitionConfig()
    """How an E+P node splits its TPCs between encoder and local prefill, per micro-batch."""
    stealing: WorkStealingConfig = WorkStealingConfig()
    """Cross-type work stealing on E nodes (not E+P: that GPU's spare time already goes to its prefill worker)."""
    engine: EngineLimits = EngineLimits()
    """Batching limits of every LLM engine (P, D, P+D, local prefill, stolen)."""

    @model_validator(mode="after")
    def _every_stage_served(self) -> Deployment:
        roles = [n.role for n in self.nodes]
        have = sorted(set(roles))
        for label, allowed in (("encode", ENCODE_ROLES), ("prefill", PREFILL_ROLES), ("decode", DECODE_ROLES)):
            if not allowed & set(roles):
                raise ValueError(f"no {label}-capable node (one of {sorted(allowed)}); roles given: {have}")
        if HANDOFF_ROLES & set(roles) and "D" not in roles:
            raise ValueError(f"roles {sorted(HANDOFF_ROLES & set(roles))} hand KV caches to a D node, but there is "
                             f"none (P+D never imports KV); roles given: {have}")
        if "E" in roles and not REMOTE_PREFILL_ROLES & set(roles):
            raise ValueError(f"E nodes send every prefill to a P or P+D node (an E+P node's local prefill worker only "
                             f"serves its own encoder), and there is none; roles given: {have}")
        if "D" in roles and not HANDOFF_ROLES & set(roles):
            raise ValueError(f"D nodes only decode KV caches handed over by P or E+P nodes, and there is none; "
                             f"roles given: {have}")
        names = self.names
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"node names must be unique, repeated: {dupes}")
        return self

    @property
    def names(self) -> list[str]:
        """Each node's id, in order."""
        return [n.name or f"{i}-{n.role}-{n.tier}" for i, n in enumerate(self.nodes)]

    @property
    def policy(self) -> PolicyConfig:
        """The run-time knobs as the admin endpoint stores them (PUT /v1/admin/policy)."""
        return PolicyConfig(batch=self.batch, offload=self.offload, stealing=self.stealing, partition=self.partition)

    def node_prices(self, tier_price_per_hour: dict[str, float]) -> dict[str, float]:
        """$/h per node name from $/h per tier (what `summarize` takes)."""
        missing = sorted({n.tier for n in self.nodes} - set(tier_price_per_hour))
        if missing:
            raise ValueError(f"no $/h for tiers {missing}; prices given for {sorted(tier_price_per_hour)}")
        return {name: tier_price_per_hour[n.tier] for name, n in zip(self.names, self.nodes)}

    @classmethod
    def parse(cls, spec: str, **knobs: object) -> Deployment:
        """Nodes from a compact string, e.g. "2xE@rtx4090, E+P@l40s, P+D@a100"; `knobs` are the other fields."""
        nodes = []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            m = re.fullmatch(r"(?:(\d+)\s*x\s*)?(E\+P|P\+D|E|P|D)\s*@\s*(\S+)", part)
            if m is None:
                raise ValueError(f"cannot parse node {part!r}: expected [<count>x]<role>@<tier>, "
                                 f"role one of E, E+P, P, D, P+D")
            nodes += [GPUNode(tier=m[3], role=m[2])] * int(m[1] or 1)
        return cls(nodes=nodes, **knobs)
