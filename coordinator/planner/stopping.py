"""HAS stage 2's stopping rules (EAServe): stop when the top-3 trials differ by under 1%, or when 5 trials
in a row bring no improvement. Pure functions of the objective history, so they are tested on
hand-made histories and shared by every searcher that wants them.

Values are objectives to MAXIMISE (good requests per dollar). A history of zeros (nothing met the
SLO yet) never counts as converged: three equal zeros are not three equally good configurations.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field


class StoppingConfig(BaseModel):
    """The rules' constants; the defaults are the seeds'."""

    model_config = ConfigDict(frozen=True)

    enabled: bool = True
    """False runs the whole budget (the baselines, or a benchmark wanting full curves)."""
    top_k: int = Field(3, ge=2)
    """How many of the best trials must agree."""
    tolerance: float = Field(0.01, ge=0)
    """They agree when (best - k-th best) < tolerance x best."""
    patience: int = Field(5, ge=1)
    """Stop after this many trials in a row without a new best."""
    min_trials: int = Field(0, ge=0)
    """Neither rule fires before this many trials (HAS sets it to its number of seeded trials, so every
    stage-1 survivor is tried at least once)."""


def top_k_converged(values: Sequence[float], top_k: int, tolerance: float) -> bool:
    """Whether the `top_k` best values lie within `tolerance` (relative) of the best."""
    if len(values) < top_k:
        return False
    top = sorted(values, reverse=True)[:top_k]
    return top[0] > 0 and (top[0] - top[-1]) < tolerance * top[0]


def trials_without_improvement(values: Sequence[float]) -> int:
    """Trials since the last one that beat every trial before it (the first trial always counts as one)."""
    best, since = float("-inf"), 0
    for value in values:
        if value > best:
            best, since = value, 0
        else:
            since += 1
    return since


def stop_reason(values: Sequence[float], config: StoppingConfig) -> str | None:
    """Why the search should stop after these trials (in trial order), or None to go on."""
    if not config.enabled or len(values) < max(config.min_trials, 1):
        return None
    if top_k_converged(values, config.top_k, config.tolerance):
        return f"top-{config.top_k} trials within {config.tolerance:.0%}"
    stale = trials_without_improvement(values)
    if stale >= config.patience:
        return f"{stale} trials in a row without improvement"
    return None
