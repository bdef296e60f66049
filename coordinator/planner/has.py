"""HAS stage 2: Optuna TPE over each stage-1 survivor's knobs, seeded, resumable, with the seeds' stopping rules.

One study covers all survivors: the allocation is a categorical parameter (when there is more than one)
and each allocation's knobs are its own parameters ("a0.B", "a0.s", "a0.split", "a0.steal"), so
TPE (multivariate, grouped: it models each allocation's knobs jointly) learns each allocation's surface
separately while the categorical moves the budget towards the better allocations. The study starts
with one enqueued trial per survivor at stage 1's seeds (B_max, s*, dynamic split, stealing off), then
TPE proposes. Stopping: top-3 within 1% or 5 trials without improvement (stopping.py), never before
every seed ran.

Storage: in memory by default; an RDB URL (e.g. sqlite:///plan.db) makes the study resumable. A
second run with the same storage and study name continues it: earlier trials count towards the
budget and the history, seeds are not enqueued twice, and the stopping rules see every trial. Each
trial's configuration and outcome are stored as user attributes, so a resumed run rebuilds its records
without re-running anything. A study created for other allocations is refused, not mixed.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import optuna
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import SQLAlchemyError

from coordinator.planner.search import OnTrial, SearchResult, TrialRecord
from coordinator.planner.space import SPLITS, Knobs, KnobSpace, TrialConfig
from coordinator.planner.stopping import StoppingConfig, stop_reason
from coordinator.planner.trials import TrialBackend, TrialOutcome

ALLOCATIONS_ATTR = "tierserve.allocations"
STOP_ATTR = "tierserve.stop_reason"


class StudyError(ValueError):
    """The study's storage cannot be opened, or holds a study of this name for another search space."""


class HasConfig(BaseModel):
    """Stage 2's settings."""

    model_config = ConfigDict(frozen=True)

    trials: int = Field(30, ge=1)
    """Trial budget of the whole study, earlier runs of a resumed study included (EAServe: 30)."""
    seed: int = 0
    """Seed of the TPE sampler."""
    stopping: StoppingConfig = StoppingConfig()
    """The stopping rules; min_trials is raised to the number of seeds."""
    random_startup: int = Field(2, ge=0)
    """Random proposals after the seeds before TPE models the surface (TPE needs a few points)."""
    pass_through_seeds: bool = False
    """Also seed each survivor at B = 1 (after every B_max seed): pass-through is the other end of the batch
    range and, below saturation, often the best latency at the same goodput; TPE, given a few trials per
    layout, rarely proposes it (the planner suite: Qwen2.5-VL video on 1xE+3xP+D, B=11 lost 3.5% to B=1)."""
    storage: str | None = None
    """RDB URL of a resumable study (sqlite:///plan.db); None keeps it in memory."""
    study_name: str = "tierserve-plan"
    """Name of the study in the storage; one storage may hold several."""


@contextmanager
def _quiet_optuna() -> Iterator[None]:
    """Optuna logs every trial at INFO and warns that multivariate TPE is experimental; the planner
    reports trials itself. Restores the previous verbosity afterwards."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(before)


def _params(index: int, space: KnobSpace, knobs: Knobs, label: str | None) -> dict:
    params: dict = {} if label is None else {"allocation": label}
    params[f"a{index}.B"] = knobs.batch
    if space.s_range is not None:
        params[f"a{index}.s"] = knobs.s
    if space.has_local:
        params[f"a{index}.split"] = knobs.split
    if space.can_steal:
        params[f"a{index}.steal"] = knobs.stealing
    return params


def _suggest(trial: optuna.Trial, index: int, space: KnobSpace) -> Knobs:
    batch = trial.suggest_int(f"a{index}.B", 1, space.b_max)
    s, split, steal = space.fixed_s, "dynamic", False
    if space.s_range is not None:
        s = trial.suggest_float(f"a{index}.s", *space.s_range)
    if space.has_local:
        split = trial.suggest_categorical(f"a{index}.split", SPLITS)
    if space.can_steal:
        steal = trial.suggest_categorical(f"a{index}.steal", (False, True))
    return Knobs(batch=batch, s=s, split=split, stealing=steal)


def _open_study(spaces: Sequence[KnobSpace], config: HasConfig, n_seeds: int) -> optuna.Study:
    labels = [s.allocation.label() for s in spaces]
    sampler = optuna.samplers.TPESampler(seed=config.seed, multivariate=True, group=True,
                                         n_startup_trials=n_seeds + config.random_startup)
    try:
        study = optuna.create_study(storage=config.storage, study_name=config.study_name, direction="maximize",
                                    sampler=sampler, load_if_exists=True)
    except SQLAlchemyError as exc:
        reason = str(exc).splitlines()[0]
        raise StudyError(f"cannot open the study storage {config.storage!r}: {reason}; give an RDB URL such as "
                         f"sqlite:///plan.db in a writable directory") from None
    stored = study.user_attrs.get(ALLOCATIONS_ATTR)
    if stored is None:
        study.set_user_attr(ALLOCATIONS_ATTR, labels)
    elif stored != labels:
        raise StudyError(f"study {config.study_name!r} in {config.storage} was created for allocations {stored}, "
                         f"not {labels}; give another --storage file or study name to start afresh")
    return study


def _records(study: optuna.Study) -> list[TrialRecord]:
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return [TrialRecord(number=i, config=TrialConfig.model_validate_json(t.user_attrs["config"]),
                        outcome=TrialOutcome.model_validate_json(t.user_attrs["outcome"]),
                        seeded=bool(t.user_attrs.get("seeded", False)))
            for i, t in enumerate(sorted(done, key=lambda t: t.number))]


def seed_points(spaces: Sequence[KnobSpace], config: HasConfig,
                starts: Sequence[TrialConfig] = ()) -> list[tuple[int, Knobs]]:
    """(space index, knobs) of every enqueued trial, in order and without repeats: the caller's `starts` (a
    warm start: the plan in force and its neighbours, each clipped into its allocation's space), then each
    survivor's B_max seed, then (pass_through_seeds) each survivor at B = 1."""
    index = {s.allocation.label(): i for i, s in enumerate(spaces)}
    points: list[tuple[int, Knobs]] = []
    for start in starts:
        i = index.get(start.allocation.label())
        if i is None:
            raise ValueError(f"warm start {start.label()} is in no search space; give its allocation a knob space "
                             f"(planning.search adds one for every start)")
        points.append((i, spaces[i].clip(start.knobs)))
    points += [(i, sp.seed()) for i, sp in enumerate(spaces)]
    if config.pass_through_seeds:
        points += [(i, sp.seed().model_copy(update={"batch": 1})) for i, sp in enumerate(spaces)]
    return list(dict.fromkeys(points))


def stage2(spaces: Sequence[KnobSpace], backend: TrialBackend, config: HasConfig | None = None,
           on_trial: OnTrial | None = None, starts: Sequence[TrialConfig] = ()) -> SearchResult:
    """Search the survivors' knobs with TPE until the budget is spent or a stopping rule fires; `starts`
    are run first (see `seed_points`)."""
    cfg = config or HasConfig()
    if not spaces:
        raise ValueError("HAS stage 2 needs at least one stage-1 survivor; stage 1 kept none")
    labels = [s.allocation.label() for s in spaces]
    seeds = seed_points(spaces, cfg, starts)
    stopping = cfg.stopping.model_copy(update={"min_trials": max(cfg.stopping.min_trials, len(seeds))})
    with _quiet_optuna():
        study = _open_study(spaces, cfg, len(seeds))
        records = _records(study)
        if not study.trials:
            for i, knobs in seeds:
                study.enqueue_trial(_params(i, spaces[i], knobs, labels[i] if len(spaces) > 1 else None),
                                    user_attrs={"seeded": True})
        reason = stop_reason([r.outcome.objective for r in records], stopping)

        def objective(trial: optuna.Trial) -> float:
            index = labels.index(trial.suggest_categorical("allocation", labels)) if len(spaces) > 1 else 0
            space = spaces[index]
            trial_config = TrialConfig(allocation=space.allocation, knobs=_suggest(trial, index, space))
            outcome = backend.evaluate(trial_config)
            trial.set_user_attr("config", trial_config.model_dump_json())
            trial.set_user_attr("outcome", outcome.model_dump_json())
            record = TrialRecord(number=len(records), config=trial_config, outcome=outcome,
                                 seeded=bool(trial.user_attrs.get("seeded", False)))
            records.append(record)
            if on_trial is not None:
                on_trial(record)
            return outcome.objective

        def check(study: optuna.Study, _: optuna.trial.FrozenTrial) -> None:
            nonlocal reason
            reason = stop_reason([r.outcome.objective for r in records], stopping)
            if reason is not None:
                study.set_user_attr(STOP_ATTR, reason)
                study.stop()

        left = cfg.trials - len(records)
        if reason is None and left > 0:
            study.optimize(objective, n_trials=left, callbacks=[check])
    return SearchResult(method="has", budget=cfg.trials, records=tuple(records), stop_reason=reason)
