"""Discrete-event simulator of a deployment, driving the same policy objects as the live runtime.

    sim = Simulator(deployment, service_times, kv_bytes_per_token=..., embedding_bytes_per_token=...)
    result = sim.run(workload.generate(10_000, seed=1))
    summary = result.summary(SLO(ttft_s=1.0, tpot_s=0.05), deployment.node_prices({...}))

One heap of events, no threads, no wall clock. A request: arrives at the least-loaded encode node
(ties rotate, as the coordinator's least_loaded does); its BatchPolicy releases it in a micro-batch;
the batch is encoded (ServiceTimes.encode_s); each request is kept by work stealing, or routed by the
OffloadRouter to the node's local prefill worker (E+P, no transfer) or to the least-loaded remote
P / P+D node (embedding transfer, ServiceTimes.transfer_s); the prefill step gives the first token; a
P or E+P prefill hands the KV cache to the least-loaded D node (transfer of prompt x kv_bytes_per_token,
timed by the service's optional kv_transfer_s where it has one);
decode steps (continuous batching) produce the rest.

Engines step as llm_node's engine does (sim_engine.py): one step = a batched prefill of the requests
admitted this step followed by one decode forward over every running sequence, timed prefill_s +
decode_step_s; so a P+D node interleaves prefills into its decode stream at step granularity. A step
is one event for its whole batch, and runs of decode-only steps are "coasted" with one event in all
(sim_llm.py); every step's own duration still comes from decode_step_s, so TPOT keeps step granularity.
With EngineLimits.pad_to_longest (llm_node's reference engine, which pads every batched forward to its
longest sequence) a step is timed at batch x the longest prompt / context rather than their total.

Modelling choices (and limits):
- A micro-batch mixing modalities costs one encode_s per modality, over all its items, at their mean
  tokens per item (a packed, variable-length encoder); the worker's own max_batch_size is assumed >= B.
- Transfers never contend for a link; they only add latency (embeddings: a few MB; DESIGN: < 2.5 %).
- LLM engines are limited by max_num_seqs and the token budget; KV-cache memory is not modelled.
- E+P sharing: see sim_gpu.py. Work stealing only on E nodes.
- `shared_cores`: nodes whose workers time-slice one processor (a local CPU cluster with more workers
  than cores): k of them computing at once each run at 1/k (sim_gpu.SharedCore), or at core_sharing/k
  where switching between them is not free. Such nodes step one job at a time through the core, without
  coasting.
- `load_report_s`: LLM workers report their load with each heartbeat (every 0.5 s live: the registry's
  interval), so the encode worker routes and steals on loads up to that old; > 0 makes every
  P / P+D / D node's load, as routing and WorkStealing see it, a snapshot taken that often. 0: exact.
- The coordinator's hops (sim_stack.py): a request reaches its encode node after the stack's way in,
  and the client has its first and last token after the way out (PerfModel.request_hops_s: a profile's
  measured request latency, split). By default they are plain delays; `stack_cores` names the nodes
  whose cores the coordinator floats over (a one-host CPU cluster) and its share of CPU on each: its hops
  and the rest of its CPU then run on those cores beside the workers, slowing them and slowed by them.
- A service with `under_load(rate, output_tokens)` (PerfModel) is asked for its view at the run's
  offered load (requests over their arrival span, mean output length): on a one-host CPU cluster the
  serving stack's own CPU work slows the workers sharing its cores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from coordinator.planner.deployment import Deployment
from coordinator.planner.goodput import SLO, NodeUsage, RequestRecord, Summary, summarize
from coordinator.planner.service import ServiceTimes
from coordinator.planner.sim_compute import ComputeMeter
from coordinator.planner.sim_engine import Flight
from coordinator.planner.sim_events import EventQueue
from coordinator.planner.sim_gpu import CoreLane, SharedCore, SharedGPU
from coordinator.planner.sim_encode import EncodeNode
from coordinator.planner.sim_llm import LLMNode
from coordinator.planner.sim_noise import HostNoise, HostSpeed, HostTrace, NoisyService
from coordinator.planner.sim_stack import STACK_LANES, Stack, StackCore, StackPlacement
from coordinator.planner.workload import SimRequest
from coordinator.protocol.roles import LLM_ROLE_OF_NODE, STAGES_OF_NODE
from coordinator.policies.offload import OffloadCounts, OffloadRouter
from coordinator.policies.registry import make_batch_policy
from coordinator.policies.sm_partition import SMPartition
from coordinator.policies.work_stealing import WorkStealing



@dataclass(frozen=True)
class EncodeStats:
    """What one encode node's policies did during a run."""

    name: str
    """The encode node."""
    offload: OffloadCounts
    """The OffloadRouter's totals (local / remote / fallbacks)."""
    stolen: int
    """Requests kept by work stealing."""
    longest_stolen_step_s: float
    """The most one stolen step can have delayed an encode batch."""


@dataclass(frozen=True)
class SimResult:
    """Everything a run recorded."""

    records: list[RequestRecord]
    """One per request, in arrival order."""
    usage: list[NodeUsage]
    """One per node, in deployment order."""
    encoders: list[EncodeStats]
    """One per encode node, in deployment order."""
    events: int
    """Events processed (the simulator's own cost)."""
    stack_cpu_s: dict[str, float] = field(default_factory=dict)
    """With stack cores: the stack's CPU seconds run on each core (a node on it names it; sim_stack.py)."""
    compute_s: dict[str, float] = field(default_factory=dict)
    """With record_compute: request-weighted compute seconds per stage, as live workers report them
    (sim_compute.py); empty otherwise."""
    compute_windows: dict[int, dict[str, float]] = field(default_factory=dict)
    """With record_compute and compute_window_s: compute_s per window of simulated time (window index -> stage ->
    seconds, of the forwards that ended in it); empty otherwise."""
    decode_compute_s: dict[int, float] = field(default_factory=dict)
    """With record_compute: request id -> the compute of the engine steps it decoded in, as its worker's timer
    reports it (its decode_s; sim_compute.py); requests that never decoded are left out."""

    def summary(self, slo: SLO, price_per_hour: Mapping[str, float] | None = None) -> Summary:
        """Goodput etc. under `slo`; `price_per_hour` by node name (Deployment.node_prices)."""
        return summarize(self.records, slo, self.usage, price_per_hour)


class Cluster:
    """One run's nodes and the routing between them (built fresh per run: policies hold state)."""

    def __init__(self, deployment: Deployment, service: ServiceTimes, kv_bytes_per_token: int,
                 embedding_bytes_per_token: int, default_tpcs: int, coast: bool,
                 shared_cores: Sequence[Collection[str]] = (), load_report_s: float = 0.0,
                 stack_cores: Mapping[str, float] | None = None, stack_placement: StackPlacement = "share",
                 relay_per_step: bool = False, offload_routed_before: int = 0, wake_affine: bool = False,
                 stack_loop_share: float = 0.0, stack_preempts: bool = False, core_sharing: float = 1.0,
                 group_sharing: Sequence[float] = ()) -> None:
        self.deployment = deployment
        self.group_sharing = tuple(group_sharing)
        """core_sharing of each shared_cores group, where given (Simulator.group_sharing)."""
        self.stack_preempts = stack_preempts
        self.core_sharing = core_sharing
        """What k >= 2 busy lanes of a time-sliced processor get of it in all (Simulator.core_sharing)."""
        self.coast = coast
        """Let LLM nodes coast through plain decode steps (sim_llm.py); same results, far fewer events."""
        self.load_report_s = load_report_s
        """How often LLM nodes report their load (Simulator.load_report_s); 0: routing sees it exactly."""
        self.service = service
        self.meter: ComputeMeter | None = None
        """Sums the workers' compute seconds as live workers report them (Simulator(record_compute=True))."""
        self.kv_bytes_per_token = kv_bytes_per_token
        self.embedding_bytes_per_token = embedding_bytes_per_token
        self.events = EventQueue()
        self.encoders: list[EncodeNode] = []
        self.remote_prefill: list[LLMNode] = []
        self.decoders: list[LLMNode] = []
        self.usage: list[NodeUsage] = []
        self._rr = 0
        ws_cfg = deployment.stealing
        lanes = self._core_lanes(shared_cores, stack_cores or {})
        gpus: dict[str, SharedGPU] = {}
        for name, node in zip(deployment.names, deployment.nodes):
            steals = node.role == "E" and ws_cfg.enabled
            stages = STAGES_OF_NODE[node.role] | ({"stolen"} if steals else set())
            usage = NodeUsage(name, node.tier, node.role, stages=frozenset(stages))
            self.usage.append(usage)
            if node.role in ("E", "E+P"):
                gpu = None
                if node.role == "E+P":
                    gpu = gpus[name] = SharedGPU(self.events, SMPartition(node.tpcs or default_tpcs,
                                                                          deployment.partition), usage, core_sharing)
                router = OffloadRouter(deployment.offload.s)
                router.continue_after(offload_routed_before)
                self.encoders.append(EncodeNode(
                    self, usage, node.host, make_batch_policy(deployment.batch), router,
                    gpu, WorkStealing(ws_cfg) if steals else None, lanes.get(name)))
                continue
            llm = LLMNode(self, usage, node.host, LLM_ROLE_OF_NODE[node.role], lanes.get(name))
            (self.decoders if node.role == "D" else self.remote_prefill).append(llm)
        self.has_remote_prefill = bool(self.remote_prefill)
        self.saturation_load = deployment.offload.saturation_load
        wakers = {n: gpus[n] if n in gpus else lanes[n].core for n in deployment.names if n in gpus or n in lanes}
        self.stack = Stack(self.events, service, self._stack_cores(stack_cores or {}, lanes, gpus),
                           idlest=stack_placement in ("idlest", "float", "load"),
                           floating=stack_placement in ("float", "load"), by_load=stack_placement == "load",
                           relay_per_step=relay_per_step, wakers=wakers if wake_affine else None,
                           loop_share=stack_loop_share)

    def _stack_cores(self, shares: Mapping[str, float], lanes: dict[str, CoreLane],
                     gpus: dict[str, SharedGPU]) -> list[StackCore]:
        """The stack's lanes on each core its nodes name (nodes on one core pool their shares), its
        shares normalised to add up to 1."""
        total = sum(shares.values())
        by_core: dict[int, tuple[SharedCore | SharedGPU, float, str]] = {}
        for name, share in shares.items():
            proc = gpus[name] if name in gpus else lanes[name].core
            assert isinstance(proc, (SharedCore, SharedGPU))
            _, before, first = by_core.get(id(proc), (proc, 0.0, name))
            by_core[id(proc)] = (proc, before + share / total, first)
        first = self.stack_preempts
        return [StackCore(proc.lane(STACK_LANES[0], first, stack=True), proc.lane(STACK_LANES[1], first, stack=True),
                          share, node)
                for proc, share, node in by_core.values()]

    def _core_lanes(self, shared_cores: Sequence[Collection[str]], stack_cores: Mapping[str, float]
                    ) -> dict[str, CoreLane]:
        """A lane on its core for every node named in `shared_cores` (E+P nodes excluded: their two
        workers already share one processor, sim_gpu.SharedGPU), and for every other node the stack
        runs beside (a core of its own with that node's worker; an E+P node's processor takes the stack's
        lanes itself)."""
        names, roles = self.deployment.names, dict(zip(self.deployment.names, (n.role for n in self.deployment.nodes)))
        lanes: dict[str, CoreLane] = {}
        for i, group in enumerate(shared_cores):
            unknown = sorted(set(group) - set(names))
            if unknown:
                raise ValueError(f"shared_cores[{i}] names nodes {unknown} that the deployment lacks; its nodes: {names}")
            if any(roles[n] == "E+P" for n in group):
                raise ValueError(f"shared_cores[{i}] = {sorted(group)}: an E+P node already shares its processor "
                                 f"between its encoder and its prefill worker; it cannot join a shared core")
            again = sorted(set(group) & set(lanes))
            if again:
                raise ValueError(f"nodes {again} are on more than one shared core")
            core = SharedCore(self.events, f"core {i}",
                              self.group_sharing[i] if i < len(self.group_sharing) else self.core_sharing)
            lanes.update({n: core.lane(n) for n in group})
        unknown = sorted(set(stack_cores) - set(names))
        if unknown:
            raise ValueError(f"stack_cores names nodes {unknown} that the deployment lacks; its nodes: {names}")
        if stack_cores and (any(v < 0 for v in stack_cores.values()) or sum(stack_cores.values()) <= 0):
            raise ValueError(f"stack_cores shares must be >= 0 with a positive sum, got {dict(stack_cores)}")
        for name in stack_cores:
            if name not in lanes and roles[name] != "E+P":
                lanes[name] = SharedCore(self.events, f"core of {name}", self.core_sharing).lane(name)
        return lanes

    def load_of(self, node: EncodeNode | LLMNode) -> int:
        """A node's load as routing sees it: an LLM node's last report when loads are reported."""
        return node.reported_load if self.load_report_s and isinstance(node, LLMNode) else node.load

    def report_loads(self, _: object = None) -> None:
        """A heartbeat of every LLM node; the next one while anything else is still to happen."""
        for n in self.remote_prefill + self.decoders:
            n.reported_load = n.load
        if self.events.next_time() < float("inf"):
            self.events.at(self.events.now + self.load_report_s, self.report_loads)

    def least_loaded(self, nodes: list) -> object:
        """Lowest load; ties rotate so equal nodes share the traffic (coordinator least_loaded)."""
        self._rr += 1
        loads = [self.load_of(n) for n in nodes]
        low = min(loads)
        ties = [n for n, load in zip(nodes, loads) if load == low]
        return ties[self._rr % len(ties)]

    def encode_s(self, tier: str, batch: list[Flight], service: ServiceTimes | None = None) -> float:
        """One encoder forward over the micro-batch, on `service` (by default the cluster's)."""
        service = service or self.service
        if len(batch) == 1:
            r = batch[0].record.request
            return service.encode_s(tier, r.modality, r.items, r.tokens_per_item)
        groups: dict[str, list[int]] = {}
        for f in batch:
            r = f.record.request
            g = groups.setdefault(r.modality, [0, 0])
            g[0] += r.items
            g[1] += r.embedding_tokens
        return sum(service.encode_s(tier, m, items, max(1, round(tokens / items)))
                   for m, (items, tokens) in groups.items())

    def remote_loads(self) -> list[int]:
        return [self.load_of(n) for n in self.remote_prefill]

    def min_remote_load(self) -> int | None:
        return min(self.remote_loads(), default=None)

    def send_to_prefill(self, f: Flight, src: EncodeNode, now: float) -> None:
        dst = self.least_loaded(self.remote_prefill)
        f.record.prefill_node = dst.name
        nbytes = f.record.request.embedding_tokens * self.embedding_bytes_per_token
        self._transfer(f, nbytes, src.tier, src.host, dst, now)

    def hand_off_kv(self, f: Flight, tier: str, host: str | None, now: float) -> None:
        dst = self.least_loaded(self.decoders)
        f.record.decode_node = dst.name
        # a service may time KV hand-offs apart from other transfers (PerfModel.kv_transfer_s: a measured KV hop)
        way = getattr(self.service, "kv_transfer_s", None) or self.service.transfer_s
        self._transfer(f, f.prompt * self.kv_bytes_per_token, tier, host, dst, now, way)

    def _transfer(self, f: Flight, nbytes: int, tier: str, host: str | None, dst: LLMNode, now: float,
                  way: Callable[[int, str, str, bool], float] | None = None) -> None:
        """The tensors' way to `dst` (timed by `way`, the service's transfer_s by default). The receiving end's
        CPU, which the measured hop holds, is charged to the engine's admitting step instead where the service
        times admissions (Engine.admit_s): the request pays it once, and the batch it joins waits through it too."""
        same_host = host is not None and host == dst.host
        dst.incoming += 1
        seconds = (way or self.service.transfer_s)(nbytes, tier, dst.tier, same_host) - dst.engine.admit_s()
        self.events.at(now + max(0.0, seconds), dst.receive, f)


class Simulator:
    """Runs request lists through a deployment; each `run` starts from a fresh cluster."""

    def __init__(self, deployment: Deployment, service: ServiceTimes, *, kv_bytes_per_token: int,
                 embedding_bytes_per_token: int, default_tpcs: int = 64, coast: bool = True,
                 shared_cores: Sequence[Collection[str]] = (), load_report_s: float = 0.0,
                 stack_cores: Mapping[str, float] | None = None, stack_placement: StackPlacement = "share",
                 relay_per_step: bool = False, offload_routed_before: int = 0, wake_affine: bool = False,
                 stack_loop_share: float = 0.0, stack_preempts: bool = False, host_noise: HostNoise | None = None,
                 core_sharing: float = 1.0, group_sharing: Sequence[float] = (),
                 record_compute: bool = False, compute_stretched: float = 0.0, compute_window_s: float = 0.0,
                 compute_stack_stretched: float | None = None,
                 host_trace: HostTrace | None = None) -> None:
        if load_report_s < 0:
            raise ValueError(f"load_report_s must be >= 0, got load_report_s={load_report_s!r}")
        for name, value in (("kv_bytes_per_token", kv_bytes_per_token),
                            ("embedding_bytes_per_token", embedding_bytes_per_token), ("default_tpcs", default_tpcs)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {name}={value!r}")
        self.deployment = deployment
        self.service = service
        self.kv_bytes_per_token = kv_bytes_per_token
        """KV-cache bytes per prompt token (all layers, K and V): what a P -> D hand-off moves."""
        self.embedding_bytes_per_token = embedding_bytes_per_token
        """Bytes per embedding token (hidden size x dtype bytes): what E -> P moves."""
        self.default_tpcs = default_tpcs
        """TPCs of an E+P GPU whose node does not say (64: an RTX 4090's 128 SMs)."""
        self.coast = coast
        """Run plain decode steps without an event each (True); False steps every one through the event
        queue, which gives the same results (up to the order of simultaneous events) more slowly."""
        self.shared_cores = [frozenset(g) for g in shared_cores]
        """Groups of node names whose workers time-slice one core (module docstring); [] for none."""
        self.load_report_s = load_report_s
        """Seconds between LLM nodes' load reports, as routing and stealing see them (module docstring); 0: exact."""
        self.stack_cores = dict(stack_cores or {})
        """Node -> share of the coordinator's CPU spent on that node's core (sim_stack.py; shares are
        normalised, nodes on one core pool theirs); empty: its hops are delays."""
        if stack_placement not in ("share", "idlest", "float", "load"):
            raise ValueError(f"stack_placement must be 'share', 'idlest', 'float' or 'load', got {stack_placement!r}")
        if offload_routed_before < 0:
            raise ValueError(f"offload_routed_before must be >= 0, got {offload_routed_before!r}")
        self.relay_per_step = relay_per_step
        """With stack cores: the token relay's CPU (stack_cpu_s per token) is charged once per engine step
        that published tokens, however many sequences it decoded: the worker publishes a step's tokens in
        one Redis round trip and the coordinator reads them in one XREAD (replies.py). False: per token."""
        self.offload_routed_before = offload_routed_before
        """Prefills each encode node's OffloadRouter routed before this run: a live cluster's router keeps
        its deterministic line across requests (offload.py), so a replay after N earlier image requests
        (probes, a warm-up) starts N decisions in; 0: a fresh router."""
        self.wake_affine = wake_affine
        """With stack_placement "idlest" or "float": when no core has fewer other busy lanes than the rest, a
        stack job a worker's event woke (the relay of its tokens, the way out of its first and last token,
        the finished request's rest) runs on that worker's core, not on the core with the larger share:
        Linux wakes a task on the waker's CPU or its previous one when no CPU of the cache domain is idle
        (select_task_rq_fair: wake_affine, select_idle_sibling), and the relay chain (worker -> Redis ->
        coordinator -> client) is woken from the worker's core. False: ties go to the larger share."""
        if not 0.0 <= stack_loop_share <= 1.0:
            raise ValueError(f"stack_loop_share must be in [0, 1], got {stack_loop_share!r}")
        self.stack_loop_share = stack_loop_share
        """With stack cores: the coordinator's share of the stack's relay and per-request CPU (the rest is
        Redis and the client). The coordinator is one asyncio event loop: that share runs in the hops' queue,
        so under load a request's way in and its tokens' way out wait behind relaying (sim_stack.py)."""
        self.stack_preempts = stack_preempts
        """With stack cores: the stack's lanes run before the workers on their core (the workers wait while
        a stack job runs), not beside them at an equal share. Its hops and relay are chains of brief
        wake-ups (worker -> Redis -> coordinator -> client), and Linux's scheduler lets a briefly woken task
        preempt one that computes continuously: on this host (kernel 6.18, EEVDF) a 1 ms job woken beside a
        busy process ran at full speed while a 16-32 ms one ran at half (benchmarks/results/
        sim_fidelity_layouts.md). The workers lose the same CPU either way; what changes is who waits: the
        hops stop growing with the workers' load. False: processor sharing."""
        self.stack_placement: StackPlacement = stack_placement
        """How the stack's jobs spread over its cores: "share" runs each job's share on each core (the
        measured proportion); "idlest" runs each job whole on the core with the fewest busy workers as it
        starts, as the OS places a woken floating process (shares only break ties); "float" is "idlest"
        whose running job also moves, once everything due at an instant has run, to a core with fewer other
        busy lanes than its own: the OS pulls a runnable floating process onto a freer core (load balancing),
        so it is not time-sliced with a worker that merely started its next step while another core idles.
        "load" is "float" where a core's busy workers weigh before the stack's own busy jobs: a stack job
        queues beside another stack job (two short wake-ups time-slicing) rather than beside a worker that
        computes, and moves off a worker's core once a core without a busy worker is free. Linux places a
        woken task by the cores' utilisation, where a pinned worker in a burst keeps its core full: a
        combined worker decoding with the stack relaying its tokens ran 0.99 of its wall time on its CPU
        (benchmarks/worker_cpu.py), and the live decode cadence between forwards matches the profile's
        engine overhead with nothing of the stack in it (benchmarks/results/sim_fidelity_s24/)."""
        if not 0.0 < core_sharing <= 1.0:
            raise ValueError(f"core_sharing must be in (0, 1], got core_sharing={core_sharing!r}")
        if len(group_sharing) > len(shared_cores) or any(not 0.0 < g <= 1.0 for g in group_sharing):
            raise ValueError(f"group_sharing gives one share in (0, 1] per shared_cores group "
                             f"({len(shared_cores)} here), got {list(group_sharing)!r}")
        self.group_sharing = tuple(group_sharing)
        """core_sharing for each shared_cores group in turn (the rest, and the stack's cores, take core_sharing):
        what two processes time-slicing a core lose depends on their working sets (benchmarks/core_sharing.py:
        two decode workers 0.948, encode beside prefill 0.815)."""
        self.core_sharing = core_sharing
        """The share of a time-sliced processor (a shared core, an unpartitioned E+P processor) that k >= 2
        busy lanes get in all, each core_sharing/k: switching between processes costs the one coming back
        its caches (sim_gpu.py; benchmarks/core_sharing.py measures it). 1.0: perfect processor sharing."""
        self.record_compute = record_compute
        """Sum the workers' compute seconds as the live workers report them (SimResult.compute_s; sim_compute.py):
        needs a service with `without_overheads()` (PerfModel)."""
        if not 0.0 <= compute_stretched <= 1.0:
            raise ValueError(f"compute_stretched must be in [0, 1], got {compute_stretched!r}")
        self.compute_stretched = float(compute_stretched)
        """With record_compute: the share of its stretch a forward on a time-sliced processor counts with, as a live
        worker's timer around it sees it (sim_compute.ComputeMeter.stretch); 0: at its own length, 1: at its wall
        length."""
        if compute_stack_stretched is not None and not 0.0 <= compute_stack_stretched <= 1.0:
            raise ValueError(f"compute_stack_stretched must be in [0, 1] or None, got {compute_stack_stretched!r}")
        self.compute_stack_stretched = compute_stack_stretched
        """With record_compute: the same share for the part of a forward's stretch the serving stack's lanes caused
        (sim_gpu._Lane.held_by_stack); None: compute_stretched."""
        if not (compute_window_s >= 0 and math.isfinite(compute_window_s)):
            raise ValueError(f"compute_window_s must be a finite number of seconds >= 0, got {compute_window_s!r}")
        self.compute_window_s = compute_window_s
        """With record_compute: also sum the compute per window of this many seconds (SimResult.compute_windows),
        as a live run's per-window compute reads the host's speed over it; 0: totals only."""
        self.host_noise = host_noise
        """The host's speed varying over time (sim_noise.py): encode, prefill and decode steps take a factor of
        their profiled time that changes every `period_s`; None: always the profiled time."""
        self.host_trace = host_trace
        """The host's speed over a live run as measured (sim_noise.HostTrace): encode forwards and LLM steps take
        their window's factor of their profiled time (times host_noise's, with both); None: none."""

    def run(self, requests: Sequence[SimRequest]) -> SimResult:
        budget = self.deployment.engine.max_num_batched_tokens
        too_long = [(r.request_id, r.prompt_tokens) for r in requests if r.prompt_tokens > budget]
        if too_long:
            raise ValueError(f"{len(too_long)} prompts exceed max_num_batched_tokens={budget} (no chunked prefill), "
                             f"e.g. (request, tokens) {too_long[:3]}")
        if any(b.arrival < a.arrival for a, b in zip(requests, requests[1:])):
            raise ValueError("requests must be in arrival order")
        service = self.service
        loaded = getattr(service, "under_load", None)  # optional, like request_latency_s below
        if loaded is not None and len(requests) > 1 and requests[-1].arrival > requests[0].arrival:
            rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
            service = loaded(rate, sum(r.output_tokens for r in requests) / len(requests))
        speed = (HostSpeed(self.host_noise, clock=lambda: 0.0, trace=self.host_trace)
                 if self.host_noise is not None or self.host_trace is not None else None)
        if speed is not None:
            service = NoisyService(service, speed)
        cluster = Cluster(self.deployment, service, self.kv_bytes_per_token, self.embedding_bytes_per_token,
                          self.default_tpcs, self.coast, self.shared_cores, self.load_report_s, self.stack_cores,
                          self.stack_placement, self.relay_per_step, self.offload_routed_before, self.wake_affine,
                          self.stack_loop_share, self.stack_preempts, self.core_sharing, self.group_sharing)
        if self.record_compute:
            bare = getattr(service, "without_overheads", None)
            if bare is None:
                raise ValueError(f"record_compute needs service times that can drop their overheads "
                                 f"(without_overheads(), as PerfModel has); {type(service).__name__} cannot")
            cluster.meter = ComputeMeter(bare(), self.compute_stretched, self.compute_window_s,
                                         self.compute_stack_stretched)
        flights = [Flight(RequestRecord(r), r.prompt_tokens) for r in requests]
        events = cluster.events
        if speed is not None:
            speed.clock = lambda: events.now

        def at_encode(f: Flight) -> None:
            cluster.least_loaded(cluster.encoders).arrive(f)

        def arrive(i: int) -> None:
            cluster.stack.way_in(flights[i], at_encode)
            if i + 1 < len(flights):
                events.at(flights[i + 1].record.request.arrival, arrive, i + 1)

        if flights:
            events.at(flights[0].record.request.arrival, arrive, 0)
            if self.load_report_s:
                events.at(flights[0].record.request.arrival, cluster.report_loads)
        events.run()
        stats = [EncodeStats(e.name, e.router.counts, 0 if e.stealing is None else e.stealing.stolen_total,
                             0.0 if e.stealing is None else e.stealing.longest_step_s) for e in cluster.encoders]
        return SimResult([f.record for f in flights], cluster.usage, stats, events.processed, cluster.stack.cpu_by_core(),
                         dict(cluster.meter.totals) if cluster.meter is not None else {},
                         dict(cluster.meter.windows) if cluster.meter is not None else {},
                         dict(cluster.meter.decode_s) if cluster.meter is not None else {})
