"""A deployed cluster's inventory as the record of what runs where, changed one worker at a time.

`tierserve deploy inventory` writes the file once; a live plan switch (coordinator/oserve/host_executor.py)
then adds and removes single entries of the hosts' `encode_node_workers` / `llm_node_workers` and writes the
file back atomically, so that a later `tierserve deploy up` reproduces the layout in force. Host variables are
read from the inventory's `all.hosts` (where `tierserve deploy inventory` puts them); groups from
`all.children`, nested as deep as they are. A host keeps its groups when its last worker goes, so it stays a
candidate for the next switch.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from coordinator.deploy.hosts import DeployError
from coordinator.oserve.layout import Unit
from coordinator.planner.planfile import PlanFile
from coordinator.protocol.roles import NODE_OF_LLM_ROLE

WORKER_LISTS = {"encode": "encode_node_workers", "llm": "llm_node_workers"}
"""Host variable holding each kind of worker (deploy/roles/encode_node, llm_node)."""
GPU_COUNT_VAR = "tierserve_gpus"
"""Optional host variable: how many GPUs the host has; without it a switch assumes the host has room."""


@dataclass(frozen=True)
class WorkerDefaults:
    """What a new worker's entry takes from the plan, as `tierserve deploy inventory` sets it."""

    encode: dict = field(default_factory=dict)
    llm: dict = field(default_factory=dict)

    @classmethod
    def from_plan(cls, plan: PlanFile) -> WorkerDefaults:
        engine = {"engine": plan.engine.kind} if plan.engine.kind != "reference" else {}
        return cls(encode={"max_batch_size": plan.policy.batch.max_batch},
                   llm={"max_num_seqs": plan.engine.max_num_seqs, **engine})


@dataclass(frozen=True)
class Placed:
    """Where a worker runs: its host, its kind (encode or llm) and its inventory entry."""

    host: str
    kind: str
    entry: dict


def _mapping(parent: dict, key: str) -> dict:
    """parent[key], made an empty mapping when absent or empty (YAML's `llm:` with nothing under it)."""
    if not isinstance(parent.get(key), dict):
        parent[key] = {}
    return parent[key]


class InventoryFile:
    """The parsed inventory, its leading comment kept; `save()` replaces the file in one rename."""

    def __init__(self, doc: dict, path: Path | None = None, header: str = "") -> None:
        if not isinstance(doc, dict) or not isinstance(doc.get("all"), dict):
            raise DeployError(f"inventory {path or ''} must be a YAML inventory with an `all:` mapping, as "
                              f"`tierserve deploy inventory` writes it")
        self.doc, self.path, self.header = doc, path, header
        self.all = doc["all"]
        for key in ("hosts", "vars", "children"):
            _mapping(self.all, key)
        for host in self.all["hosts"]:
            _mapping(self.all["hosts"], host)
        self._check_workers_in_all_hosts()

    @classmethod
    def load(cls, path: Path) -> InventoryFile:
        try:
            text = path.read_text()
            doc = yaml.safe_load(text)
        except OSError as e:
            raise DeployError(f"cannot read inventory {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise DeployError(f"inventory {path} is not valid YAML: {e}") from None
        header = "".join(itertools.takewhile(lambda line: line.startswith("#"), text.splitlines(keepends=True)))
        return cls(doc, path, header)

    def save(self) -> None:
        """Write the inventory back atomically (a reader sees the old file or the new, never half of one)."""
        assert self.path is not None
        text = self.header + yaml.safe_dump(self.doc, sort_keys=False, width=110)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, self.path.stat().st_mode & 0o777 if self.path.exists() else 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _check_workers_in_all_hosts(self) -> None:
        def walk(group: dict, where: str) -> None:
            for host, hv in (group.get("hosts") or {}).items():
                if isinstance(hv, dict) and any(v in hv for v in WORKER_LISTS.values()):
                    raise DeployError(f"inventory {self.path or ''}: host {host} lists its workers under group "
                                      f"{where}; keep host variables under all.hosts, as `tierserve deploy "
                                      f"inventory` writes them, so a plan switch can rewrite them")
            for name, child in (group.get("children") or {}).items():
                walk(child or {}, name)
        walk({"children": self.all["children"]}, "all")

    # reading

    def group(self, name: str) -> list[str]:
        """The hosts of group `name` and of its children, in file order."""
        def find(children: dict) -> dict | None:
            for n, g in children.items():
                if n == name:
                    return g or {}
                if (hit := find((g or {}).get("children") or {})) is not None:
                    return hit
            return None

        def hosts(g: dict) -> list[str]:
            out = list(g.get("hosts") or {})
            for child in (g.get("children") or {}).values():
                out += hosts(child or {})
            return out

        found = find(self.all["children"])
        return list(dict.fromkeys(hosts(found))) if found is not None else []

    def host_vars(self, host: str) -> dict:
        return self.all["hosts"].setdefault(host, {})

    def workers(self) -> dict[str, Placed]:
        """Every worker of the inventory by id."""
        out = {}
        for host, hv in self.all["hosts"].items():
            for kind, var in WORKER_LISTS.items():
                for entry in hv.get(var) or []:
                    out[entry["id"]] = Placed(host, kind, entry)
        return out

    def units(self) -> list[Unit]:
        """The layout the inventory deploys, as `tierserve up`'s units (coordinator/oserve/layout.py): an encode
        worker with the LLM workers sharing its GPU (E+P with a prefill worker), then the other LLM workers."""
        placed = self.workers()
        encode, llm = [], []
        for wid, p in placed.items():
            if p.kind == "encode":
                shared = [w for w, q in placed.items() if q.kind == "llm" and q.entry.get("colocate_with") == wid]
                prefill = any(placed[w].entry["role"] == "prefill" for w in shared)
                encode.append(Unit(role="E+P" if prefill else "E", workers=(wid, *shared)))
            elif p.entry.get("colocate_with") not in placed:
                llm.append(Unit(role=NODE_OF_LLM_ROLE[p.entry["role"]], workers=(wid,)))
        return encode + llm

    def address(self, host: str) -> str:
        hv = self.all["hosts"].get(host) or {}
        return str(hv.get("tierserve_advertise_address") or hv.get("ansible_host") or host)

    def _only(self, group: str) -> str:
        hosts = self.group(group)
        if len(hosts) != 1:
            raise DeployError(f"inventory {self.path or ''} needs exactly one host in group {group}, has "
                              f"{len(hosts)}")
        return hosts[0]

    @property
    def key_prefix(self) -> str:
        return str(self.all["vars"].get("tierserve_key_prefix", "tierserve"))

    def redis_url(self, password: str) -> str:
        port = self.all["vars"].get("tierserve_redis_port", 6379)
        return f"redis://:{password}@{self.address(self._only('redis'))}:{port}/0"

    def coordinator_url(self) -> str:
        port = self.all["vars"].get("tierserve_coordinator_port", 8000)
        return f"http://{self.address(self._only('coordinator'))}:{port}"

    # changing

    def place(self, worker_id: str, role: str, colocated_with: str | None, defaults: WorkerDefaults) -> Placed:
        """Add a worker's entry on the least-loaded host of its group (encode for an encode worker, llm for the
        others; the host of `colocated_with` when given, on that worker's GPU) and return where it went.
        Load is the GPUs a host's workers hold, then its worker count; a host with `tierserve_gpus` set and
        every GPU held is skipped. The file is not written."""
        placed = self.workers()
        if worker_id in placed:
            raise DeployError(f"worker {worker_id} is already in the inventory (on {placed[worker_id].host})")
        kind = "encode" if role == "encode" else "llm"
        if colocated_with is not None:
            if colocated_with not in placed:
                raise DeployError(f"{worker_id} shares the GPU of {colocated_with}, which is not in the inventory")
            host, mate = placed[colocated_with].host, placed[colocated_with].entry
            gpu = mate.get("gpu", 0)
            template = mate
        else:
            host, gpu = self._least_loaded(kind, worker_id, placed)
            template = self._template(host, kind, placed)
        entry: dict = {"id": worker_id} | ({"role": role} if kind == "llm" else {}) | {"gpu": gpu}
        entry |= {k: template[k] for k in ("tier", "device", "dtype") if k in template}
        entry |= defaults.encode if kind == "encode" else defaults.llm
        if colocated_with is not None:
            entry["colocate_with"] = colocated_with
        self.host_vars(host).setdefault(WORKER_LISTS[kind], []).append(entry)
        if kind == "llm":
            self._join(host, role)
        return Placed(host, kind, entry)

    def _least_loaded(self, kind: str, worker_id: str, placed: dict[str, Placed]) -> tuple[str, int]:
        group = "encode" if kind == "encode" else "llm"
        candidates = []
        for order, host in enumerate(self.group(group)):
            held = {p.entry.get("gpu", 0) for p in placed.values() if p.host == host}
            count = (self.all["hosts"].get(host) or {}).get(GPU_COUNT_VAR)
            free = next(i for i in range(len(held) + 1) if i not in held)
            if count is not None and free >= int(count):
                continue
            candidates.append((len(held), sum(p.host == host for p in placed.values()), order, host, free))
        if not candidates:
            why = (f"every host of group {group} has all its GPUs ({GPU_COUNT_VAR}) in use" if self.group(group)
                   else f"group {group} has no host")
            raise DeployError(f"no host to start {worker_id} on: {why}; add a host to group {group} of the "
                              f"inventory and run `tierserve deploy up` first")
        *_, host, free = min(candidates)
        return host, free

    def _template(self, host: str, kind: str, placed: dict[str, Placed]) -> dict:
        """An existing entry whose tier, device and dtype a new worker on `host` copies: the host's own first,
        else one of the same kind elsewhere, a worker with a GPU of its own before one sharing an encoder's."""
        mine = [p for p in placed.values() if p.host == host]
        same = sorted((p for p in placed.values() if p.kind == kind), key=lambda p: "colocate_with" in p.entry)
        return (mine or same or [Placed(host, kind, {})])[0].entry

    def _join(self, host: str, role: str) -> None:
        """Put `host` in group llm's child group `role` (site.yml runs the LLM role on the llm group)."""
        llm = _mapping(self.all["children"], "llm")
        _mapping(_mapping(_mapping(llm, "children"), role), "hosts").setdefault(host, {})

    def remove(self, worker_id: str) -> Placed | None:
        """Drop a worker's entry (None if it has none); the file is not written."""
        placed = self.workers().get(worker_id)
        if placed is not None:
            entries = self.all["hosts"][placed.host][WORKER_LISTS[placed.kind]]
            entries[:] = [e for e in entries if e["id"] != worker_id]
            if not entries:
                del self.all["hosts"][placed.host][WORKER_LISTS[placed.kind]]
        return placed

    def set_plan(self, plan: PlanFile) -> None:
        """The plan's policy (site.yml puts `tierserve_policy` in force) and its summary, as `tierserve deploy
        inventory` writes them."""
        self.all["vars"]["tierserve_policy"] = plan.policy.model_dump(mode="json")
        self.all["vars"]["tierserve_plan"] = {"model": plan.model, "created_at": plan.created_at,
                                              "predicted_goodput_rps": round(plan.predicted.goodput_rps, 3),
                                              "cost_per_hour": round(plan.cost_per_hour(), 2)}
