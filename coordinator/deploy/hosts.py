"""The hosts file of `tierserve deploy inventory`: the real machines a plan is placed on.

A plan names GPUs on the planner's own host labels (node0, node1, ...) by tier; the operator says
which machines exist, how Ansible reaches them, the address other hosts reach them on, and which
GPUs of which tier each one has:

    hosts:
      - name: enc-1
        address: 10.0.0.11          # ansible_host, and the address workers advertise
        gpus: [RTX4090, RTX4090]    # CUDA device 0, 1 (tiers by catalog name or alias)
      - name: llm-1
        address: 10.0.0.21
        gpus: [{tier: A100, count: 2}]
    coordinator: llm-1              # default: the first host; Redis too unless `redis` names another
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class DeployError(ValueError):
    """A plan, hosts file or inventory problem; the message names the file, what is wrong and the fix."""


class GPUGroup(BaseModel):
    """`count` GPUs of one tier, numbered after the ones listed before them."""

    model_config = ConfigDict(extra="forbid")

    tier: str = Field(min_length=1)
    """Catalog tier name or alias (RTX4090, A100, ...)."""
    count: int = Field(1, ge=1)
    """How many."""


class Host(BaseModel):
    """One machine of the cluster."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Inventory host name (also used in worker ids)."""
    address: str = Field(min_length=1)
    """Where Ansible connects (ansible_host) and, unless `advertise_address` is set, the address the
    workers and services on this host bind and publish for the other hosts."""
    advertise_address: str | None = None
    """The cluster-internal address other hosts reach this one on, when it differs from `address`."""
    gpus: list[GPUGroup] = Field(default_factory=list)
    """GPUs in CUDA index order: a tier name, or {tier, count}."""
    ssh_user: str | None = None
    """ansible_user; default: Ansible's (the current user)."""
    python: str | None = None
    """ansible_python_interpreter on this host; default: Ansible's discovery."""
    device: str | None = None
    """Where the workers' models run (--device): default "cuda:0" (each worker sees only its own GPU through
    CUDA_VISIBLE_DEVICES); "cpu" runs them on the CPU under the GPU tier's label (rehearsals, CI)."""

    @field_validator("gpus", mode="before")
    @classmethod
    def _short_form(cls, value):
        if isinstance(value, list):
            return [{"tier": v} if isinstance(v, str) else v for v in value]
        return value

    def gpu_tiers(self) -> list[str]:
        """The tier of each CUDA index, in order."""
        return [g.tier for g in self.gpus for _ in range(g.count)]

    @property
    def reach(self) -> str:
        return self.advertise_address or self.address


class HostsFile(BaseModel):
    """Every host, and which one runs the coordinator and Redis."""

    model_config = ConfigDict(extra="forbid")

    hosts: list[Host] = Field(min_length=1)
    coordinator: str | None = None
    """Host of the coordinator (HTTP API); default: the first host."""
    redis: str | None = None
    """Host of Redis; default: the coordinator's."""

    @model_validator(mode="after")
    def _consistent(self) -> HostsFile:
        names = [h.name for h in self.hosts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"hosts {twice} are listed twice; give every host one entry")
        for field, value in (("coordinator", self.coordinator), ("redis", self.redis)):
            if value is not None and value not in names:
                raise ValueError(f"{field}: {value!r} is not one of the hosts ({', '.join(names)})")
        return self

    @property
    def coordinator_host(self) -> str:
        return self.coordinator or self.hosts[0].name

    @property
    def redis_host(self) -> str:
        return self.redis or self.coordinator_host

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)


def load_hosts(path: str | Path) -> HostsFile:
    """Read and validate a hosts file; every failure is a DeployError naming the field."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise DeployError(f"cannot read hosts file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise DeployError(f"hosts file {path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise DeployError(f"hosts file {path} must be a mapping with a `hosts:` list (see `tierserve deploy "
                          f"inventory --help`)")
    try:
        return HostsFile.model_validate(doc)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg'].removeprefix('Value error, ')}"
                 for e in exc.errors()[:8]]
        raise DeployError(f"hosts file {path} is invalid:\n" + "\n".join(lines)) from None
