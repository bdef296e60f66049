"""The simulator's input: when requests arrive and what each one asks for.

A `Workload` is an arrival process (Poisson, or Gamma-distributed gaps with a given coefficient of
variation for burstier or smoother traffic than Poisson) and a request mix (weighted request classes:
modality, items per request, embedding tokens per item, text prompt tokens, output tokens, each fixed
or drawn from a small distribution). `Workload.generate` turns it into `SimRequest`s with a seeded
numpy Generator, so the same seed always gives the same requests: a planner trial is reproducible and
two deployments can be compared on exactly the same traffic.

Sampling is vectorised (one numpy call per field per class) so 10,000 requests cost milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from coordinator.planner.service import Modality


class Fixed(BaseModel):
    """Always `value`."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=0)
    """The one value drawn."""

    def lowest(self) -> int:
        return self.value

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


class Uniform(BaseModel):
    """Integers uniform on [low, high], both included."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=0)
    """Smallest value drawn."""
    high: int = Field(ge=0)
    """Largest value drawn."""

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"uniform needs low <= high, got low={self.low} high={self.high}")
        return self

    def lowest(self) -> int:
        return self.low

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)


class Choice(BaseModel):
    """One of `values`, with probabilities proportional to `weights` (equal when omitted)."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["choice"] = "choice"
    values: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    """The values drawn from."""
    weights: list[Annotated[float, Field(ge=0.0)]] | None = None
    """Relative weight of each value; None: all equal."""

    @model_validator(mode="after")
    def _weights_match(self) -> Choice:
        if self.weights is not None and (len(self.weights) != len(self.values) or sum(self.weights) <= 0):
            raise ValueError(f"choice needs one weight per value and a positive sum, got values={self.values} "
                             f"weights={self.weights}")
        return self

    def lowest(self) -> int:
        return min(self.values)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = None if self.weights is None else np.asarray(self.weights) / sum(self.weights)
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, p=p)


class LogNormal(BaseModel):
    """Long-tailed lengths (chat output lengths look like this): a lognormal with the given mean and
    coefficient of variation, rounded and clipped to [low, high]. Clipping moves the realised mean a little."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0.0)
    """Mean before rounding and clipping."""
    cv: float = Field(gt=0.0)
    """Standard deviation / mean, before rounding and clipping."""
    low: int = Field(1, ge=0)
    """Smallest value drawn."""
    high: int | None = Field(None, ge=0)
    """Largest value drawn; None: unbounded."""

    def lowest(self) -> int:
        return self.low

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        sigma2 = np.log1p(self.cv**2)
        x = rng.lognormal(np.log(self.mean) - sigma2 / 2, np.sqrt(sigma2), size=n)
        return np.clip(np.rint(x), self.low, self.high).astype(np.int64)


def _plain_int_is_fixed(v: object) -> object:
    return {"kind": "fixed", "value": v} if isinstance(v, int) and not isinstance(v, bool) else v


IntDist = Annotated[Union[Fixed, Uniform, Choice, LogNormal], Field(discriminator="kind"),
                    BeforeValidator(_plain_int_is_fixed)]
"""A non-negative integer quantity: a plain int means Fixed(value=int)."""


class ArrivalProcess(BaseModel):
    """Renewal arrivals at `rate` req/s: exponential gaps (Poisson) or Gamma gaps with CV `cv`."""

    model_config = ConfigDict(frozen=True)
    rate: float = Field(gt=0.0, allow_inf_nan=False)
    """Λ: mean arrivals per second for the whole cluster."""
    kind: Literal["poisson", "gamma"] = "poisson"
    """poisson: exponential gaps (CV 1); gamma: Gamma gaps with shape 1/cv², the usual burstiness knob."""
    cv: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    """Coefficient of variation of the gaps (std / mean): > 1 bursty, < 1 smoother than Poisson."""

    @model_validator(mode="after")
    def _poisson_has_cv_one(self) -> ArrivalProcess:
        if self.kind == "poisson" and self.cv != 1.0:
            raise ValueError(f"a Poisson process has cv=1, got cv={self.cv}; use kind='gamma' for another cv")
        return self

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` inter-arrival gaps in seconds."""
        if self.kind == "poisson":
            return rng.exponential(1.0 / self.rate, size=n)
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, 1.0 / (self.rate * shape), size=n)

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` arrival times; the first arrives one gap after t = 0."""
        return np.cumsum(self.gaps(rng, n))


class RequestClass(BaseModel):
    """One kind of request in the mix."""

    model_config = ConfigDict(frozen=True)
    modality: Modality = "image"
    """Which encoder the request needs."""
    weight: float = Field(1.0, gt=0.0)
    """Relative share of this class among arrivals."""
    items: IntDist = Fixed(value=1)
    """Images, videos or audio clips per request (at least 1: text-only requests skip the encoder)."""
    tokens_per_item: IntDist = Fixed(value=576)
    """Embedding tokens each item becomes (LLaVA-1.5: 576 per image; video: frames x patches)."""
    prompt_tokens: IntDist = Fixed(value=64)
    """Text tokens of the prompt, besides the embeddings."""
    output_tokens: IntDist = Fixed(value=128)
    """Tokens generated, the first one by the prefill (at least 1)."""

    @model_validator(mode="after")
    def _positive_where_needed(self) -> RequestClass:
        for name in ("items", "tokens_per_item", "output_tokens"):
            low = getattr(self, name).lowest()
            if low < 1:
                raise ValueError(f"{name} must never be below 1, but its distribution allows {low}")
        return self


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One generated request."""

    request_id: int
    """Index in arrival order; doubles as its id."""
    arrival: float
    """Seconds since the start of the run."""
    modality: Modality
    """Which encoder it needs."""
    items: int
    """Media items (images, videos, clips)."""
    tokens_per_item: int
    """Embedding tokens per item."""
    text_tokens: int
    """Prompt tokens that are text."""
    output_tokens: int
    """Tokens to generate (>= 1)."""

    @property
    def embedding_tokens(self) -> int:
        return self.items * self.tokens_per_item

    @property
    def prompt_tokens(self) -> int:
        """What the prefill processes: text plus embeddings."""
        return self.text_tokens + self.items * self.tokens_per_item


class Workload(BaseModel):
    """Arrivals plus mix: everything needed to generate a reproducible request stream."""

    model_config = ConfigDict(frozen=True)
    arrivals: ArrivalProcess
    """When requests arrive."""
    mix: list[RequestClass] = Field(default_factory=lambda: [RequestClass()], min_length=1)
    """What they ask for; each request's class is drawn by weight."""

    def generate(self, n: int, seed: int | np.random.Generator = 0) -> list[SimRequest]:
        """`n` requests in arrival order; the same seed (or Generator state) gives the same list."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got n={n}")
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        times = self.arrivals.times(rng, n)
        weights = np.asarray([c.weight for c in self.mix])
        cls = rng.choice(len(self.mix), size=n, p=weights / weights.sum())
        fields = np.zeros((4, n), dtype=np.int64)
        for k, c in enumerate(self.mix):
            idx = np.flatnonzero(cls == k)
            for row, dist in enumerate((c.items, c.tokens_per_item, c.prompt_tokens, c.output_tokens)):
                fields[row, idx] = dist.sample(rng, len(idx))
        items, per_item, text, out = (f.tolist() for f in fields)
        modality = [c.modality for c in self.mix]
        return [SimRequest(i, t, modality[k], items[i], per_item[i], text[i], out[i])
                for i, (t, k) in enumerate(zip(times.tolist(), cls.tolist()))]
