"""What a system costs to run, and what that makes each good request and each output token cost.

`--cost-per-hour X` gives the cluster's $/h directly; `--gpus 2xRTX4090,2xA100` prices the GPUs from
the planner's tier catalog (coordinator/planner/catalog.yaml, overridable with --catalog FILE), so
bench and planner agree on prices. Either may be prefixed `SYSTEM=` to price one system of a
comparison differently (systems of one run usually run on different hardware).

  cost per 1k good requests = $/h / (goodput req/s * 3600) * 1000   (DESIGN: cost per goodput)
  cost per 1M output tokens = $/h / (output tokens/s * 3600) * 1e6  (every completed request's tokens)
Both are None when their denominator is zero: no finite price buys something that never happened.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class CostError(ValueError):
    """A price that cannot be used; the message names the option."""


class Cost(BaseModel):
    """A system's hourly price and where it came from."""

    model_config = ConfigDict(frozen=True)

    per_hour: float = Field(ge=0)
    """USD per hour for the whole system under test."""
    source: str
    """How the price was obtained, e.g. "--gpus 2xRTX4090,2xA100 (catalog: RTX4090 $0.69/h x2, ...)"."""


def per_1k_good(per_hour: float, goodput_rps: float) -> float | None:
    return per_hour / (goodput_rps * 3600.0) * 1e3 if goodput_rps > 0 else None


def per_1m_tokens(per_hour: float, output_tokens_per_s: float) -> float | None:
    return per_hour / (output_tokens_per_s * 3600.0) * 1e6 if output_tokens_per_s > 0 else None


def price_gpus(spec: str, catalog_files: list[Path]) -> Cost:
    """"2xRTX4090,2xA100" -> the sum of catalog prices, with a source naming each tier's price."""
    from coordinator.planner.allocation import parse_inventory
    from coordinator.planner.catalog import CatalogError, load_catalog

    try:
        catalog = load_catalog(*catalog_files)
        inventory = parse_inventory(spec, catalog)
    except CatalogError as e:
        raise CostError(f"--catalog: {e}") from None
    except (KeyError, ValueError) as e:
        raise CostError(f"--gpus {spec!r}: {e.args[0] if e.args else e}") from None
    parts, total = [], 0.0
    for name, count in inventory.items():
        tier = catalog.tier(name)
        total += tier.price_per_hour * count
        when = f", {tier.price_date}" if tier.price_date else ""
        parts.append(f"{count}x{name} ${tier.price_per_hour:g}/h ({tier.price_source}{when})")
    return Cost(per_hour=round(total, 6), source=f"--gpus {spec}: " + "; ".join(parts))


def _split(item: str) -> tuple[str | None, str]:
    name, eq, value = item.partition("=")
    return (name.strip(), value.strip()) if eq else (None, item.strip())


def resolve_costs(systems: list[str], cost_per_hour: list[str], gpus: list[str],
                  catalog_files: list[Path]) -> dict[str, Cost]:
    """Each system's Cost from the repeatable --cost-per-hour / --gpus items ([SYSTEM=]VALUE); an item
    without SYSTEM= applies to every system no named item covers. Systems left unpriced are absent."""
    named: dict[str, Cost] = {}
    default: Cost | None = None
    for option, items in (("--cost-per-hour", cost_per_hour), ("--gpus", gpus)):
        for item in items:
            system, value = _split(item)
            if system is not None and system not in systems:
                raise CostError(f"{option} {item!r}: no system {system!r} in this run; systems: {', '.join(systems)}")
            if option == "--cost-per-hour":
                try:
                    price = float(value)
                except ValueError:
                    raise CostError(f"--cost-per-hour {item!r}: {value!r} is not a number of dollars") from None
                if not price >= 0 or price == float("inf"):
                    raise CostError(f"--cost-per-hour {item!r}: the price must be a finite number >= 0")
                cost = Cost(per_hour=price, source=f"--cost-per-hour {value}")
            else:
                cost = price_gpus(value, catalog_files)
            if system is None:
                if default is not None:
                    raise CostError(f"{option} {item!r}: a price for every system was already given "
                                    f"({default.source}); prefix SYSTEM= to price one system")
                default = cost
            elif system in named:
                raise CostError(f"{option} {item!r}: system {system!r} already has a price ({named[system].source})")
            else:
                named[system] = cost
    return {s: named.get(s, default) for s in systems if named.get(s, default) is not None}  # type: ignore[misc]
