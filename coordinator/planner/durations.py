"""Durations a user types on a command line: one reading for `tierserve plan`, `tierserve bench` and the rest.

Every duration may carry a unit (us, ms, s, min). A bare number means milliseconds where the flag is a
latency target (SLO: `--slo ttft=2000` and `--goodput ttft:2000` are both two seconds, as in vLLM's
`--goodput`); flags that read seconds before this rule existed (bench's `--timeout` and `--duration`, the SLO
flags of benchmarks/sim_fidelity.py and benchmarks/control_point.py, the coordinator's `--request-timeout`,
`--max-wait` and `--batch-timeout`) refuse a bare number instead, so an old `--timeout 300` or `--slo-ttft 0.2`
stops with a message rather than silently becoming milliseconds. (Flags whose name carries the unit, as
`--drain-timeout-s`, read that unit.)
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

UNITS_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}
"""Seconds per unit, for every unit a duration may carry."""
UNIT_HELP = "a number with a unit (us, ms, s, min), e.g. 2s or 1500ms"

_NUMBER_UNIT = re.compile(r"\s*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?inf|nan)\s*([a-zµ]*)\s*",
                          re.IGNORECASE)


class DurationError(ValueError):
    """A duration that cannot be read; the message names the flag, what was typed and the accepted form."""


def parse_duration_s(text: str, what: str, bare: str | None = "ms") -> float:
    """Seconds from "2s", "1500ms", "250us", "1.5min"; a bare number is in `bare` units ("ms"), or refused
    when `bare` is None. The result is finite and > 0."""
    m = _NUMBER_UNIT.fullmatch(text)
    unit = m.group(2).lower() if m else ""
    if m is None or (unit and unit not in UNITS_S):
        bare_form = "a number of milliseconds or " if bare == "ms" else ""
        raise DurationError(f"cannot read {what}={text!r}: not {bare_form}{UNIT_HELP}")
    if not unit:
        if bare is None:
            raise DurationError(f"{what}={text!r} has no unit; write {UNIT_HELP} "
                                f"(e.g. {text.strip()}s for seconds)")
        unit = bare
    value = float(m.group(1)) * UNITS_S[unit]
    if not math.isfinite(value) or value <= 0:
        raise DurationError(f"{what} must be a finite, positive time, got {text!r}")
    return value


def parse_targets(items: list[str] | str, keys: tuple[str, ...], required: tuple[str, ...],
                  flag: str, example: str) -> dict[str, float]:
    """{"ttft": seconds, ...} from "ttft=2s,tpot=100ms" or ["ttft:2000", "tpot:100"] (either separator, items
    comma-joined or separate; bare numbers in milliseconds). Unknown, repeated or missing keys are refused."""
    parts = [p.strip() for raw in ([items] if isinstance(items, str) else items) for p in raw.split(",")]
    form = f"write {flag} {example} (bare numbers are milliseconds; units us, ms, s, min)"
    found: dict[str, float] = {}
    for part in filter(None, parts):
        m = re.fullmatch(r"([a-zA-Z0-9_]+)\s*[:=]\s*(\S.*)", part)
        if m is None:
            raise DurationError(f"{flag} part {part!r} is not KEY=TIME; {form}")
        key = m.group(1).lower()
        if key not in keys:
            raise DurationError(f"{flag} part {part!r}: unknown metric {key!r}; use {', '.join(keys)}. {form}")
        if key in found:
            raise DurationError(f"{flag} gives {key} twice; {form}")
        found[key] = parse_duration_s(m.group(2), key)
    missing = [k for k in required if k not in found]
    if missing:
        both = "both " if len(required) == 2 else ""
        raise DurationError(f"{flag} needs {both}{' and '.join(required)} (missing: {', '.join(missing)}); {form}")
    return found


def duration_arg(flag: str) -> Callable[[str], float]:
    """An argparse type: seconds from a time that must carry its unit. For flags that once read bare seconds,
    so an old `--timeout 300` or `--slo-ttft 0.2` stops with a message instead of meaning milliseconds."""

    def parse(text: str) -> float:
        try:
            return parse_duration_s(text, flag, bare=None)
        except DurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "duration"
    return parse
