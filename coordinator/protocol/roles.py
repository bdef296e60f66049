"""The one vocabulary of roles: what a worker process does, and what a planned GPU does.

A worker process has a `Role` (it registers under it and the dispatcher routes by it). A GPU in a plan
has a `NodeRole`, the HAS notation the planner, the simulator and plan files use:

- E: an encode worker alone on its GPU (it may steal language work when stealing is enabled);
- E+P: an encode worker plus its co-located prefill worker, sharing the GPU;
- P: a prefill worker; hands each KV cache to a D node;
- D: a decode worker; takes KV caches from P and E+P nodes;
- P+D: a combined worker (prefill and decode on one GPU, no KV transfer).

Every translation between the two lives here.
"""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["encode", "prefill", "decode", "combined"]
"""A worker process's role."""
LLMRole = Literal["combined", "prefill", "decode"]
"""The roles of an LLM worker (and modes of its engine)."""
LLM_ROLES: tuple[LLMRole, ...] = get_args(LLMRole)
PREFILLING: frozenset[Role] = frozenset({"prefill", "combined"})
"""Workers that take prompts (where encoders and the dispatcher send prefill jobs)."""

NodeRole = Literal["E", "E+P", "P", "D", "P+D"]
"""A planned GPU's role."""
NODE_ROLES: tuple[NodeRole, ...] = get_args(NodeRole)
LLM_ROLE_OF_NODE: dict[NodeRole, LLMRole] = {"P": "prefill", "D": "decode", "P+D": "combined"}
"""The LLM worker a P, D or P+D GPU runs (an E+P GPU runs a prefill worker beside its encoder)."""
NODE_OF_LLM_ROLE: dict[LLMRole, NodeRole] = {v: k for k, v in LLM_ROLE_OF_NODE.items()}
STAGES_OF_NODE: dict[NodeRole, frozenset[str]] = {
    "E": frozenset({"encode"}), "E+P": frozenset({"encode", "prefill"}), "P": frozenset({"prefill"}),
    "D": frozenset({"decode"}), "P+D": frozenset({"prefill", "decode"})}
"""The serving stages each planned GPU runs."""
