"""Service times per tier: measured profiles where present, a roofline estimate from the catalog otherwise.

`PerfModel` implements `ServiceTimes` (service.py). The roofline time of a forward pass is
max(FLOPs / (peak * compute_efficiency), bytes / (bandwidth * memory_efficiency)) + a fixed launch
overhead: whichever of compute or memory traffic takes longer bounds it. Encoders and prefill come
out compute-bound, decode memory-bound (weights and KV cache are read once per step), which is the
asymmetry the tiered design is built on. Transfers are bytes over the narrowest link plus a latency.

A profile measured on a live cluster may also carry the serving stack's overheads (profile.py,
ProfileOverheads): with `overheads=True` (the default) they are added where they occur: busy time
to the stage's service time, the measured hop as the transfer latency into that tier, and the
request latency outside every worker through `request_latency_s`, which the simulator adds to TTFT.
The engine loop's per-step cost is counted once per step, with its decode part (decode_step_s); a
prefill adds only what its step measured beyond that (prefill_step_s - decode_step_s). So a step that
prefills and decodes pays the loop once, as live; a step with prefills alone is short by the loop's
fixed part (under a millisecond on the CPU tier: it only shows in an idle cluster's TTFT).

When the workers share their host's cores with the serving stack (a CPU cluster on one machine), the
stack's CPU work at the offered load takes a share of those cores: `under_load(rate, tokens)` gives a
view whose contended times are stretched by 1 / (1 - stack CPU busy share), a first-order
processor-sharing estimate; the simulator asks for it with the workload's own rate. Which times are
contended is `host_contention` (Contention): "uniform" spreads the stack over every shared core and
stretches everything, which overshoots mean TPOT under load (the LLM worker's core is busy, so the
scheduler puts the stack elsewhere); "encode_core" puts it on the encode worker's core, stretching
encode and the stack's own request latency only, which is what the per-stage timings of the live
cluster show (benchmarks/results/sim_fidelity.json, ttft_stages: encode and the stack's hops grow
with load, the LLM's share does not beyond batching). Off ("none") by default: on a GPU cluster the
stack does not share the accelerators.

A deployment variant's worker (variants.py: fp8/int8 weights, tensor parallel) is asked for by its service
key, "A100-80GB[int8/tp2]": its prefill and decode times are the bf16 one-GPU times scaled by the
roofline's ratio of the two (variant_perf.py), so measured profiles keep their calibration.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.arch import ModelArch
from coordinator.planner.catalog import Catalog, Tier
from coordinator.planner.profile import Profile, ProfileOverheads
from coordinator.planner.service import Modality
from coordinator.planner.variant_perf import time_ratio
from coordinator.planner.variants import split_key

ACTIVATION_PASSES = 8
"""Rough count of hidden-state-sized reads/writes per layer per token (attention and MLP in/out)."""


class RooflineConfig(BaseModel):
    """Defaults of the roofline estimate; a tier's own values in the catalog take precedence."""

    model_config = ConfigDict(frozen=True)

    compute_efficiency: float = Field(0.6, gt=0, le=1)
    """Share of peak FLOP/s a real forward pass reaches (large GEMMs reach 0.6-0.8; small batches less)."""
    memory_efficiency: float = Field(0.8, gt=0, le=1)
    """Share of peak memory bandwidth a streaming read reaches."""
    launch_overhead_s: float = Field(0.001, ge=0)
    """Fixed time per forward pass: kernel launches and scheduling (about 1 ms with CUDA graphs)."""


class NetworkConfig(BaseModel):
    """Links between GPUs, for transfer times."""

    model_config = ConfigDict(frozen=True)

    nic_gbps: float = Field(100.0, gt=0)
    """Network speed between hosts, Gbit/s (per direction)."""
    network_latency_s: float = Field(50e-6, ge=0)
    """Fixed cost of one transfer between hosts (RDMA/TCP setup and notification)."""
    host_latency_s: float = Field(10e-6, ge=0)
    """Fixed cost of one transfer inside a host."""
    use_nvlink: bool = True
    """Same host and same NVLink tier: use NVLink instead of PCIe."""


def encode_cost(arch: ModelArch, modality: Modality, batch: int, tokens_per_item: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one encoder forward: linear layers on every position, attention within spans."""
    enc = arch.encoder(modality)
    seq = tokens_per_item * enc.input_tokens_per_output_token
    span = min(seq, enc.attention_span_tokens or seq)
    full = min(enc.full_attention_layers, enc.layers)
    attention = 4 * seq * enc.hidden * ((enc.layers - full) * span + full * seq)
    flops = batch * (2 * enc.params * seq + attention)
    activations = batch * seq * enc.hidden * enc.layers * ACTIVATION_PASSES * arch.dtype_bytes
    return flops, enc.params * arch.dtype_bytes + activations + batch * arch.embedding_bytes(tokens_per_item)


def prefill_cost(arch: ModelArch, tokens: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one prefill over `tokens` tokens, counted as ONE causal sequence (an upper
    bound on attention when several shorter sequences are batched: the term is small below ~8k tokens)."""
    llm = arch.llm
    flops = 2 * llm.params * tokens + 2 * llm.layers * tokens * tokens * llm.heads * llm.head_dim
    activations = tokens * llm.hidden * llm.layers * ACTIVATION_PASSES * arch.dtype_bytes
    return flops, arch.llm_weight_bytes() + tokens * arch.kv_bytes_per_token() + activations


def prefill_batch_cost(arch: ModelArch, lengths: Sequence[int]) -> tuple[float, float]:
    """(FLOPs, bytes) of one prefill step over several sequences, each its own causal attention, the
    weights read once."""
    if len(lengths) == 1:
        return prefill_cost(arch, lengths[0])
    costs = [prefill_cost(arch, n) for n in lengths]
    weights = arch.llm_weight_bytes()
    return sum(f for f, _ in costs), weights + sum(b - weights for _, b in costs)


def decode_cost(arch: ModelArch, batch: int, context_tokens: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step: every weight and every cached key/value is read once."""
    llm = arch.llm
    flops = 2 * llm.params * batch + 4 * llm.layers * context_tokens * llm.heads * llm.head_dim
    kv = arch.kv_bytes_per_token()
    return flops, arch.llm_weight_bytes() + (context_tokens + batch) * kv


@dataclass(frozen=True, slots=True)
class _TierRates:
    """One tier's roofline constants, worked out once: the simulator asks for them ~10^5 times a run,
    and resolving the name through the catalog (alias matching) cost more than the arithmetic."""

    name: str
    """Canonical tier name (the key of PerfModel.profiles)."""
    flops_s: float
    """Achievable FLOP/s: peak x compute efficiency."""
    bytes_s: float
    """Achievable bytes/s: bandwidth x memory efficiency."""
    overhead_s: float
    """Fixed seconds per forward pass."""


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {name}={value!r}")


Contention = Literal["none", "uniform", "encode_core"]
"""How the serving stack's CPU (coordinator, Redis, clients) slows a one-host CPU cluster under load:
  none         not at all (a real GPU cluster: the stack has its own cores);
  uniform      its share of all the shared cores stretches every time;
  encode_core  it runs on the encode worker's core (the scheduler's pick while the LLM cores are busy),
               stretching encode times and its own per-request latency; LLM steps keep their speed."""
CONTENTION = ("none", "uniform", "encode_core")


class PerfModel:
    """ServiceTimes for one model: measured profiles first, then the roofline estimate of each tier."""

    def __init__(self, catalog: Catalog, arch: ModelArch, profiles: Mapping[str, Profile] | Iterable[Profile] = (),
                 roofline: RooflineConfig | None = None, network: NetworkConfig | None = None,
                 overheads: bool = True, host_contention: bool | Contention = False,
                 hop_in_share: float | None = None) -> None:
        self.catalog = catalog
        self.use_overheads = overheads
        """Apply the profiles' measured overheads; False reads their compute points alone."""
        if hop_in_share is not None and not 0.0 <= hop_in_share <= 1.0:
            raise ValueError(f"hop_in_share must be within [0, 1], got hop_in_share={hop_in_share!r}")
        self.hop_in_share = hop_in_share
        """The way in's share of request_latency_s for profiles that did not measure request_in_s (measured
        elsewhere, e.g. from a live run's per-hop marks); None: such a profile's latency is all way out."""
        self.contention: Contention = "uniform" if host_contention is True else (host_contention or "none")
        """How under_load lets the serving stack's CPU slow things down (Contention)."""
        if self.contention not in CONTENTION:
            raise ValueError(f"host_contention must be one of {CONTENTION}, got {host_contention!r}")
        self.slowdown = 1.0
        """LLM and transfer times are multiplied by this (> 1 under host CPU contention; see under_load)."""
        self.encode_slowdown = 1.0
        """Encode times are multiplied by this."""
        self.prefill_slowdown: float | None = None
        """Prefill steps are multiplied by this; None: by `slowdown`, as the LLM's other times. A host that slows
        short forwards (a decode step, ~2 ms) and long ones (a prefill, ~20 ms) by different amounts runs the two
        at different factors (benchmarks/sim_fidelity_speed.py reads them apart from a live run)."""
        self.stack_slowdown = 1.0
        """request_latency_s (the stack's own time per request) is multiplied by this."""
        self.arch = arch
        self.roofline = roofline or RooflineConfig()
        self.network = network or NetworkConfig()
        self.profiles: dict[str, Profile] = {}
        for profile in profiles.values() if isinstance(profiles, Mapping) else profiles:
            if profile.model != arch.name:
                raise ValueError(f"profile for tier {profile.tier!r} was measured on model {profile.model!r}, "
                                 f"not {arch.name!r}; profile this model or drop the file")
            tier = catalog.resolve(profile.tier)
            if tier in self.profiles:
                raise ValueError(f"two profiles for tier {tier!r}; keep one")
            self.profiles[tier] = profile
        self._rates: dict[str, _TierRates] = {}
        """Tier constants by the name callers used (alias or canonical). Safe to keep: the catalog, its
        tiers and the configs are frozen; unknown names are never cached, so they still raise."""
        self._links: dict[tuple[str, str, bool], float] = {}
        """link_bytes_s by (src, dst, same_host), for the same reason."""

    def _tier_rates(self, tier: Tier) -> _TierRates:
        ce = tier.compute_efficiency or self.roofline.compute_efficiency
        me = tier.memory_efficiency or self.roofline.memory_efficiency
        overhead = self.roofline.launch_overhead_s if tier.launch_overhead_s is None else tier.launch_overhead_s
        return _TierRates(tier.name, tier.peak_flops * ce, tier.bandwidth_bytes_s * me, overhead)

    def _rates_of(self, name: str) -> _TierRates:
        rates = self._rates.get(name)
        if rates is None:  # a variant's service key ("A100[int8/tp2]") shares its tier's rates
            rates = self._rates[name] = self._tier_rates(self.catalog.tier(split_key(name)[0]))
        return rates

    def _variant_ratio(self, key: str, cost: tuple[float, float], kv: float, tokens: int) -> float:
        """Time of a variant worker over the bf16 one-GPU worker's, for a pass of that bf16 `cost`."""
        tier_name, variant = split_key(key)
        tier = self.catalog.tier(tier_name)
        r = self._rates_of(key)
        return time_ratio(self.arch, tier, variant, cost, kv, tokens, r.flops_s / tier.peak_flops,
                          r.bytes_s / tier.bandwidth_bytes_s, r.overhead_s, self.network.host_latency_s)

    def roofline_s(self, tier: str | Tier, flops: float, nbytes: float) -> float:
        """Roofline time of one forward pass on one GPU of `tier`."""
        r = self._tier_rates(tier) if isinstance(tier, Tier) else self._rates_of(tier)
        return max(flops / r.flops_s, nbytes / r.bytes_s) + r.overhead_s

    def source(self, tier: str, stage: Literal["encode", "prefill", "decode"],
               modality: Modality = "image") -> Literal["measured", "roofline"]:
        """Which model answers for `stage` on `tier`, for reports."""
        p = self.profiles.get(self.catalog.resolve(split_key(tier)[0]))
        measured = p is not None and bool(
            {"encode": modality in p.encode, "prefill": p.prefill, "decode": p.decode}[stage])
        return "measured" if measured else "roofline"

    def _profile(self, tier: str) -> Profile | None:
        return self.profiles.get(self._rates_of(tier).name)

    def _overheads(self, tier: str) -> ProfileOverheads | None:
        p = self._profile(tier) if self.use_overheads else None
        return p.overheads if p is not None else None

    def request_latency_s(self) -> float:
        """Seconds every request spends outside the workers (the coordinator's hops): the largest any
        profile measured, as it belongs to the serving stack rather than to one tier; 0 without one."""
        if not self.use_overheads:
            return 0.0
        found = (p.overheads.request_latency_s for p in self.profiles.values() if p.overheads)
        return max(found, default=0.0) * self.stack_slowdown

    def request_hops_s(self) -> tuple[float, float]:
        """request_latency_s split into its way in (client -> the encode worker has the request) and its
        way out (the first token -> the client), from the profile that set the latency: its measured
        request_in_s, else `hop_in_share` of it, else all of it out."""
        if not self.use_overheads:
            return 0.0, 0.0
        found = [p.overheads for p in self.profiles.values() if p.overheads]
        if not found:
            return 0.0, 0.0
        o = max(found, key=lambda x: x.request_latency_s)
        total = o.request_latency_s
        way_in = (min(total, o.request_in_s) if o.request_in_s is not None
                  else total * (self.hop_in_share or 0.0))
        return way_in * self.stack_slowdown, (total - way_in) * self.stack_slowdown

    def stack_cpu_s(self, output_tokens: int) -> float:
        """CPU seconds the serving stack spends on one request of `output_tokens` tokens (its hops included):
        the largest any profile measured; 0 without one or with overheads off."""
        if not self.use_overheads:
            return 0.0
        return max((o.stack_cpu_request_s + o.stack_cpu_token_s * output_tokens
                    for p in self.profiles.values() if (o := p.overheads) is not None), default=0.0)

    def stack_load(self, rate: float, output_tokens: float) -> float:
        """Share of the cores it contends for that the serving stack keeps busy at `rate` req/s of
        `output_tokens` tokens each: of all shared cores ("uniform") or of one ("encode_core"); the
        largest over profiles that measured it (0 when none did, overheads are off, or contention is "none")."""
        if not self.use_overheads or self.contention == "none":
            return 0.0
        shares = [(o.stack_cpu_request_s + o.stack_cpu_token_s * output_tokens) * rate
                  / (o.shared_cores if self.contention == "uniform" else 1)
                  for p in self.profiles.values() if (o := p.overheads) is not None and o.shared_cores]
        return max(shares, default=0.0)

    def under_load(self, rate: float, output_tokens: float) -> PerfModel:
        """A view of this model at an offered load: the contended times stretched by 1 / (1 - stack_load)
        (capped at 90 % busy: beyond that the first-order estimate means nothing); "uniform" stretches
        every time, "encode_core" the encoder's and the stack's own; "none" changes nothing."""
        view = copy.copy(self)
        stretch = 1.0 / (1.0 - min(0.9, self.stack_load(rate, output_tokens)))
        view.encode_slowdown = self.encode_slowdown * stretch
        view.stack_slowdown = self.stack_slowdown * stretch
        if self.contention == "uniform":
            view.slowdown = self.slowdown * stretch
            if self.prefill_slowdown is not None:
                view.prefill_slowdown = self.prefill_slowdown * stretch
        return view

    def without_overheads(self) -> PerfModel:
        """A view of this model reading the compute points alone (overheads off), at the same slowdowns: the
        forwards' own time, as the workers' compute timers report it (sim_compute.py)."""
        view = copy.copy(self)
        view.use_overheads = False
        return view

    def encode_s(self, tier: str, modality: Modality, batch: int, tokens_per_item: int) -> float:
        _check_counts(batch=batch, tokens_per_item=tokens_per_item)
        if batch == 0:
            return 0.0
        p = self._profile(tier)
        measured = p.encode_s(modality, batch, tokens_per_item) if p else None
        if measured is None:
            measured = self.roofline_s(tier, *encode_cost(self.arch, modality, batch, tokens_per_item))
        o = self._overheads(tier)
        return (measured if o is None else measured + o.encode_batch_s + o.encode_request_s * batch) * self.encode_slowdown

    def prefill_s(self, tier: str, tokens: int) -> float:
        return self.prefill_batch_s(tier, (tokens,))

    def prefill_batch_s(self, tier: str, lengths: Sequence[int]) -> float:
        """One prefill step over sequences of these prompt lengths (the same for each when the engine pads
        them to the longest), each with its own causal attention: measured points as Profile.prefill_batch_s
        reads them, else the roofline of prefill_batch_cost; the step's overheads once. prefill_s is the
        step of one sequence."""
        for n in lengths:
            _check_counts(tokens=n)
        lengths = [n for n in lengths if n]
        if not lengths:
            return 0.0
        if "[" in tier:
            base = self.prefill_batch_s(split_key(tier)[0], lengths)
            tokens = sum(lengths)
            cost = prefill_batch_cost(self.arch, lengths)
            return base * self._variant_ratio(tier, cost, tokens * self.arch.kv_bytes_per_token(), tokens)
        p = self._profile(tier)
        measured = p.prefill_batch_s(lengths) if p else None
        if measured is None:
            measured = self.roofline_s(tier, *prefill_batch_cost(self.arch, lengths))
        o = self._overheads(tier)
        factor = self.slowdown if self.prefill_slowdown is None else self.prefill_slowdown
        return (measured if o is None else measured + max(0.0, o.prefill_step_s - o.decode_step_s)) * factor

    def decode_step_s(self, tier: str, batch: int, context_tokens: int) -> float:
        if batch < 0 or context_tokens < 0:  # the hottest call in a simulation: check without building kwargs
            _check_counts(batch=batch, context_tokens=context_tokens)
        if batch == 0:
            return 0.0
        if "[" in tier:
            base = self.decode_step_s(split_key(tier)[0], batch, context_tokens)
            kv = (context_tokens + batch) * self.arch.kv_bytes_per_token()
            return base * self._variant_ratio(tier, decode_cost(self.arch, batch, context_tokens), kv, batch)
        p = self._profile(tier)
        measured = p.decode_step_s(batch, context_tokens) if p else None
        if measured is None:
            measured = self.roofline_s(tier, *decode_cost(self.arch, batch, context_tokens))
        o = self._overheads(tier)
        return (measured if o is None else measured + o.decode_step_s + o.decode_seq_s * batch) * self.slowdown

    def admit_s(self, tier: str, role: str = "combined") -> float:
        """Seconds a running batch waits per request its engine admits, beyond what the admitting step already
        carries: ProfileOverheads.admit_s (the tensors received, the request added, its first token published,
        between steps) less, where the engine prefills, the prefill step's own overhead. Measured where a request
        joins with its embeddings (the profiling cluster's combined worker); a decode engine's KV join (`role`
        "decode") is read at the same figure. 0 without a profile of the tier or with overheads off: the
        roofline does not model it."""
        o = self._overheads(tier)
        if o is None:
            return 0.0
        carried = 0.0 if role == "decode" else max(0.0, o.prefill_step_s - o.decode_step_s)
        return max(0.0, o.admit_s - carried) * self.slowdown

    def link_bytes_s(self, src_tier: str, dst_tier: str, same_host: bool) -> float:
        """Bandwidth of the narrowest link on the way: NVLink between same-tier NVLink GPUs of one host,
        else both GPUs' PCIe links, plus the NIC between hosts."""
        key = (src_tier, dst_tier, same_host)
        found = self._links.get(key)
        if found is None:
            found = self._links[key] = self._link_bytes_s(src_tier, dst_tier, same_host)
        return found

    def _link_bytes_s(self, src_tier: str, dst_tier: str, same_host: bool) -> float:
        src, dst = self.catalog.tier(split_key(src_tier)[0]), self.catalog.tier(split_key(dst_tier)[0])
        if same_host and src.name == dst.name and src.nvlink_gbs and self.network.use_nvlink:
            return src.nvlink_gbs * 1e9
        pcie = min(src.host_link_bytes_s, dst.host_link_bytes_s)
        return pcie if same_host else min(pcie, self.network.nic_gbps * 1e9 / 8)

    def transfer_s(self, nbytes: int, src_tier: str, dst_tier: str, same_host: bool) -> float:
        return self._transfer_s(nbytes, src_tier, dst_tier, same_host, kv=False)

    def kv_transfer_s(self, nbytes: int, src_tier: str, dst_tier: str, same_host: bool) -> float:
        """transfer_s for a prefill worker's KV cache to a decode worker: the latency is the profile's measured
        KV hand-off (ProfileOverheads.kv_hop_s: the sender's registry lookup and delivery, the decode job, the
        receiver's intake) where it has one, else the embeddings' hop_s as for any transfer."""
        return self._transfer_s(nbytes, src_tier, dst_tier, same_host, kv=True)

    def _transfer_s(self, nbytes: int, src_tier: str, dst_tier: str, same_host: bool, kv: bool) -> float:
        _check_counts(nbytes=nbytes)
        if nbytes == 0:
            return 0.0
        latency = self.network.host_latency_s if same_host else self.network.network_latency_s
        o = self._overheads(dst_tier)
        if o is not None:
            # measured end to end: the send, the job message, the receiver's intake
            latency = o.kv_hop_s if kv and o.kv_hop_s is not None else o.hop_s
        return (nbytes / self.link_bytes_s(src_tier, dst_tier, same_host) + latency) * self.slowdown
