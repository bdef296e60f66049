"""The GPU-tier catalog: what each tier can do and what it costs, from catalog.yaml plus user files.

The built-in catalog.yaml beside this module seeds the tiers of DESIGN.md ("Tier facts"); a user YAML
file of the same layout adds tiers or overrides fields of existing ones (usually the price, which moves
faster than anything else here). Files merge in order, field by field, and every merged tier is
validated again, so an error names the file, the tier and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

BUILTIN_CATALOG = Path(__file__).with_name("catalog.yaml")
PCIE_X16_GBS: Mapping[int, float] = MappingProxyType({3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0})
"""Usable bandwidth of a x16 PCIe link per direction, GB/s, by generation (after line encoding)."""


class CatalogError(ValueError):
    """A catalog file is missing, unreadable or holds a bad value; the message names file, tier, field."""


class Tier(BaseModel):
    """One class of accelerator: its peak rates, memory, links and price."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """The canonical name (the key in the catalog file), used in inventories and plan files."""
    kind: Literal["gpu", "cpu"] = "gpu"
    """cpu marks the local CPU pseudo-tier: no SMs and no PCIe link of its own."""
    aliases: tuple[str, ...] = ()
    """Other names accepted for this tier (matched case-insensitively), e.g. A100 for A100-80GB."""
    peak_bf16_tflops: float = Field(gt=0)
    """Dense BF16 tensor-core peak, TFLOP/s (no sparsity)."""
    peak_fp8_tflops: float | None = Field(None, gt=0)
    """Dense FP8 tensor-core peak, TFLOP/s; None where the tier has no FP8 tensor cores (Ampere: FP8 weights
    then run weight-only at the BF16 rate, variants.py)."""
    memory_gb: float = Field(gt=0)
    """Device memory, GB."""
    bandwidth_gbs: float = Field(gt=0)
    """Device-memory bandwidth, GB/s."""
    pcie_gen: int | None = Field(None, ge=3, le=6)
    """PCIe generation of the host link (x16 unless pcie_lanes says otherwise); None for cpu."""
    pcie_lanes: int = Field(16, ge=1, le=16)
    """Lanes of the host link."""
    nvlink_gbs: float | None = Field(None, gt=0)
    """NVLink bandwidth per direction per GPU, GB/s; None when the tier has no NVLink."""
    sms: int | None = Field(None, ge=1)
    """Streaming multiprocessors; None for cpu."""
    tpcs: int | None = Field(None, ge=1)
    """Texture processing clusters (libsmctrl's mask unit); defaults to sms // 2 (2 SMs per TPC)."""
    price_per_hour: float = Field(ge=0)
    """USD per GPU-hour."""
    price_source: str = Field(min_length=1)
    """Where the price was seen (provider and offer), so a reader can check it."""
    price_date: str | None = Field(None, pattern=r"^\d{4}-\d{2}(-\d{2})?$")
    """When the price was seen, YYYY-MM; None for a user override that did not give one."""
    purchase_price_usd: float | None = Field(None, gt=0)
    """Purchase price of one GPU, for capex comparisons (HeteroServe compares by it); None if unknown."""
    purchase_source: str | None = None
    """Where the purchase price comes from."""
    estimates: tuple[str, ...] = ()
    """Names of the fields whose values are estimates rather than vendor specs or quoted prices."""
    compute_efficiency: float | None = Field(None, gt=0, le=1)
    """Roofline override: achievable share of peak FLOP/s on this tier; None = the perf model default."""
    memory_efficiency: float | None = Field(None, gt=0, le=1)
    """Roofline override: achievable share of memory bandwidth; None = the perf model default."""
    launch_overhead_s: float | None = Field(None, ge=0)
    """Roofline override: fixed seconds per forward pass; None = the perf model default."""
    notes: str = ""
    """Anything a reader should know about the numbers."""

    @field_validator("price_date", mode="before")
    @classmethod
    def _date_as_text(cls, value: Any) -> Any:
        # YAML reads an unquoted 2026-11-02 as a date; keep it as the text the user wrote.
        return value.isoformat() if isinstance(value, date) else value

    @model_validator(mode="after")
    def _check(self) -> Tier:
        unknown = sorted(set(self.estimates) - set(type(self).model_fields))
        if unknown:
            raise ValueError(f"estimates names unknown fields {unknown}; use field names of a tier")
        if self.kind == "gpu" and (self.sms is None or self.pcie_gen is None):
            raise ValueError(f"a gpu tier needs sms and pcie_gen (got sms={self.sms}, pcie_gen={self.pcie_gen})")
        if self.tpcs is not None and self.sms is not None and self.tpcs > self.sms:
            raise ValueError(f"tpcs={self.tpcs} exceeds sms={self.sms}; a TPC holds 2 SMs")
        if self.tpcs is None and self.sms is not None:
            object.__setattr__(self, "tpcs", max(1, self.sms // 2))
        return self

    @property
    def peak_flops(self) -> float:
        return self.peak_bf16_tflops * 1e12

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_gbs * 1e9

    @property
    def host_link_bytes_s(self) -> float:
        """Bytes/s per direction over the host link: PCIe, or memory bandwidth for cpu (a host copy)."""
        if self.pcie_gen is None:
            return self.bandwidth_bytes_s
        return PCIE_X16_GBS[self.pcie_gen] * self.pcie_lanes / 16 * 1e9


class Catalog(BaseModel):
    """Tiers by canonical name, plus the files they came from."""

    model_config = ConfigDict(frozen=True)

    tiers: dict[str, Tier]
    """Every tier, keyed by its canonical name."""
    files: tuple[str, ...] = ()
    """The files merged into this catalog, built-in first."""

    @model_validator(mode="after")
    def _unique_names(self) -> Catalog:
        seen: dict[str, str] = {}
        for tier in self.tiers.values():
            for label in (tier.name, *tier.aliases):
                owner = seen.setdefault(label.lower(), tier.name)
                if owner != tier.name:
                    raise ValueError(f"name {label!r} is used by tiers {owner!r} and {tier.name!r}; rename one")
        return self

    def resolve(self, name: str) -> str:
        """The canonical tier name for `name` or one of its aliases (case-insensitive)."""
        found = _match(self.tiers, name)
        if found is not None:
            return found
        raise KeyError(f"unknown GPU tier {name!r}; known: {', '.join(self.tiers)} "
                       f"(add it to a user catalog file: load_catalog(path))")

    def tier(self, name: str) -> Tier:
        return self.tiers[self.resolve(name)]

    def names(self, kind: Literal["gpu", "cpu"] | None = None) -> list[str]:
        return [t.name for t in self.tiers.values() if kind is None or t.kind == kind]


def _read(path: Path) -> dict[str, dict[str, Any]]:
    """The `tiers` mapping of one catalog file, checked for shape only."""
    if not path.is_file():
        raise CatalogError(f"catalog file {path} does not exist")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or set(doc) - {"version", "tiers"}:
        extra = sorted(set(doc) - {"version", "tiers"}) if isinstance(doc, dict) else type(doc).__name__
        raise CatalogError(f"{path}: expected a mapping with keys 'version' and 'tiers', got {extra}")
    if doc.get("version", 1) != 1:
        raise CatalogError(f"{path}: version {doc['version']!r} is not supported; this reader knows version 1")
    tiers = doc.get("tiers") or {}
    if not isinstance(tiers, dict) or not all(isinstance(v, dict) for v in tiers.values()):
        raise CatalogError(f"{path}: 'tiers' must map each tier name to a mapping of its fields")
    return {str(k): v for k, v in tiers.items()}


def _validate(raw: dict[str, Any], name: str, path: Path) -> Tier:
    try:
        return Tier(**raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "(tier)"
            got = "" if err["type"] == "missing" else f" (got {err['input']!r})"
            lines.append(f"  field {field!r}: {err['msg'].removeprefix('Value error, ')}{got}")
        raise CatalogError(f"{path}: tier {name!r} is invalid:\n" + "\n".join(lines)
                           + f"\nFix these fields under tiers.{name} in {path}.") from None


def load_catalog(*user_files: str | Path, builtin: str | Path = BUILTIN_CATALOG) -> Catalog:
    """The built-in catalog with each user file merged over it in order.

    A user entry naming an existing tier (or an alias of one) overrides just the fields it gives; a
    new name adds a tier and must give every required field. Overriding price_per_hour without a
    price_source records the file as the source and clears the date, so no stale source survives.
    """
    raws: dict[str, dict[str, Any]] = {}
    tiers: dict[str, Tier] = {}
    files: list[str] = []
    for path in (Path(builtin), *map(Path, user_files)):
        for name, fields in _read(path).items():
            canonical = _match(tiers, name) or name
            merged = {**raws.get(canonical, {}), **fields, "name": canonical}
            if canonical in raws and "price_per_hour" in fields and "price_source" not in fields:
                merged["price_source"] = f"user override in {path}"
                merged["price_date"] = fields.get("price_date")
            tiers[canonical] = _validate(merged, name, path)
            raws[canonical] = merged
        files.append(str(path))
    try:
        return Catalog(tiers=tiers, files=tuple(files))
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise CatalogError(f"catalog from {', '.join(files)}: {msg}") from None


def _match(tiers: dict[str, Tier], name: str) -> str | None:
    """The tier `name` refers to, by name or alias in any case; None when no tier has that name."""
    wanted = name.strip().lower()
    for tier in tiers.values():
        if wanted == tier.name.lower() or wanted in (a.lower() for a in tier.aliases):
            return tier.name
    return None
