"""A cluster's worker layout as planned GPUs (units), and the diff between two layouts.

A unit is one planned GPU with its NodeRole (coordinator/protocol/roles.py) and the worker processes that play
it. Units of the same role are interchangeable, so the diff keeps as many of each role as both layouts have,
starts the new layout's extra units and retires the old layout's extra ones: 1 E + 1 P+D -> 2 E + P + D keeps
the E, starts an E, a P and a D, and retires the P+D.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from coordinator.protocol.roles import LLM_ROLE_OF_NODE, NODE_OF_LLM_ROLE, NodeRole


class Unit(BaseModel):
    """One planned GPU and its processes (worker ids)."""

    model_config = ConfigDict(frozen=True)

    role: NodeRole
    workers: tuple[str, ...]


def local_units(encode_workers: int, colocated: list[frozenset[str]], llm_roles: list[str]) -> list[Unit]:
    """The units `tierserve up` starts for a ClusterSpec (its process names, launcher.py)."""
    units = []
    for i in range(encode_workers):
        extra = colocated[i] if i < len(colocated) else frozenset()
        workers = [f"encode-{i}"] + (["llm-local-" + str(i)] if "prefill" in extra else []) + (
            ["llm-steal-" + str(i)] if "steal" in extra else [])
        units.append(Unit(role="E+P" if "prefill" in extra else "E", workers=tuple(workers)))
    units += [Unit(role=NODE_OF_LLM_ROLE[r], workers=(f"llm-{i}-{r}",)) for i, r in enumerate(llm_roles)]
    return units


@dataclass(frozen=True)
class LayoutDiff:
    keep: list[Unit]
    start: list[NodeRole]
    """Roles of the units to start (their processes are named when started)."""
    retire: list[Unit]

    @property
    def empty(self) -> bool:
        return not self.start and not self.retire

    def describe(self) -> str:
        def count(roles) -> str:
            return ", ".join(f"{n} {r}" for r, n in sorted(Counter(roles).items())) or "nothing"
        return (f"start {count(self.start)}; retire {count(u.role for u in self.retire)}; "
                f"keep {count(u.role for u in self.keep)}")


def diff(current: list[Unit], target: list[NodeRole]) -> LayoutDiff:
    """What turns `current` into a layout with the roles `target`."""
    want = Counter(target)
    keep, retire = [], []
    for unit in current:
        if want[unit.role] > 0:
            want[unit.role] -= 1
            keep.append(unit)
        else:
            retire.append(unit)
    return LayoutDiff(keep, [r for r, n in want.items() for _ in range(n)], retire)


@dataclass
class Namer:
    """Fresh process names for new units, never reusing one in use (a restarted id would inherit its stream)."""

    used: set[str] = field(default_factory=set)

    def unit(self, role: NodeRole) -> list[tuple[str, str, str | None]]:
        """[(worker id, worker role, colocated with)] of a new unit of `role`."""
        if role in ("E", "E+P"):
            k = 0
            while {f"encode-{k}", f"llm-local-{k}", f"llm-steal-{k}"} & self.used:
                k += 1
            out = [(f"encode-{k}", "encode", None)] + ([(f"llm-local-{k}", "prefill", f"encode-{k}")]
                                                       if role == "E+P" else [])
        else:
            llm = LLM_ROLE_OF_NODE[role]
            k = 0
            while any(n.startswith(f"llm-{k}-") for n in self.used):
                k += 1
            out = [(f"llm-{k}-{llm}", llm, None)]
        self.used |= {name for name, _, _ in out}
        return out
