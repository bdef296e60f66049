"""Prefill role: ship a request's KV cache to a decode worker and tell it to continue.

Which decode worker: the least loaded of those taking new work. When none is (a plan switch or a rolling
restart is retiring the decode workers while this prefill still holds requests, or a decode worker's heartbeat
lapsed on a loaded machine, or one is restarting), a draining decode worker still takes the request: it runs
what reaches its stream before it stops, and if it stops first the coordinator re-runs the request, whose
holder it became. With no decode worker registered at all, the hand-off waits up to `wait_s` for one to
(re)appear before the request fails.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import torch
from redis.asyncio import Redis

from coordinator.protocol.delivery import DeliveryError, deliver, transfer_id
from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import DecodeJob, PrefillJob
from coordinator.protocol.registry import WorkerRegistry, WorkerStatus, least_loaded
from coordinator.protocol.streams import hand_over, reply_key
from transport.base import EmbeddingSender


DECODE_WAIT_S = 5.0
"""How long a hand-off waits for a decode worker to (re)appear: several heartbeat TTLs, so a beat that came
late on a loaded machine does not fail the request."""
DECODE_POLL_S = 0.1
DECODING = frozenset({"decode"})


class HandoffError(RuntimeError):
    """The request cannot continue on a decode worker; the message says why."""


class KVHandoff:
    def __init__(self, redis: Redis, keys: Keys, registry: WorkerRegistry, sender: EmbeddingSender,
                 wait_s: float = DECODE_WAIT_S):
        self.redis, self.keys, self.registry, self.sender = redis, keys, registry, sender
        self.wait_s = wait_s
        self._rr = 0

    async def decoders(self, deadline: float) -> list[WorkerStatus]:
        """The decode workers to hand to: those taking new work, else the draining ones (see the module
        docstring), else, once none registered by `deadline` (time.monotonic()), none."""
        while True:
            every = await self.registry.alive(DECODING, draining=True)
            taking = [w for w in every if not w.draining]
            if taking or every or time.monotonic() >= deadline:
                return taking or every
            await asyncio.sleep(DECODE_POLL_S)

    async def send(self, job: PrefillJob, output_token_ids: list[int], kv: torch.Tensor | None,
                   aborted: Callable[[PrefillJob], bool], rope_delta: int = 0,
                   kv_transfer_params: dict | None = None) -> str | None:
        """Returns the decode worker's id, or None if the request was aborted meanwhile. `rope_delta`
        (M-RoPE) travels with the KV cache: the decode worker cannot recompute it without the media.
        A decode worker that fails to take the cache (died, hangs, left while it was chosen) is replaced by
        another, asking the registry again until `wait_s` has passed.
        With `kv_transfer_params` (vLLM) no tensor crosses our transport: the decode engine's KV connector
        pulls the cache itself, so the least loaded decode worker gets the job with the media's grids."""
        self._rr += 1
        deadline, failures = time.monotonic() + self.wait_s, []
        while True:
            decoders = await self.decoders(deadline)
            if not decoders:
                raise HandoffError(f"KV handoff failed: {'; '.join(failures)}" if failures else
                                   f"no decode worker is alive for the KV handoff (waited {self.wait_s:.0f} s); "
                                   "start one (tierserve up --llm prefill,decode)")
            if aborted(job):
                return None
            t0 = time.perf_counter()
            if kv is None:
                target, descs = least_loaded(decoders, self._rr), []
                break
            try:
                target, descs = await deliver(self.sender, decoders, transfer_id(job.request_id, job.attempt),
                                              {"kv": kv}, lambda ws: least_loaded(ws, self._rr))
                break
            except DeliveryError as e:
                failures.append(str(e))
                if time.monotonic() >= deadline:
                    raise HandoffError(f"KV handoff failed: {'; '.join(failures)}") from e
                await asyncio.sleep(DECODE_POLL_S)
        if aborted(job):  # the decode worker drops the tensors when it hears of the abort
            return None
        timing = job.timing.mark("handoff_sent", transfer_s=job.timing.transfer_s + time.perf_counter() - t0)
        await hand_over(self.redis, self.keys, target.info.holder, DecodeJob(
            request_id=job.request_id, prompt_token_ids=job.prompt_token_ids, sampling=job.sampling,
            arrival=job.arrival, timing=timing, output_token_ids=output_token_ids, kv=descs,
            rope_delta=rope_delta, attempt=job.attempt, reply_to=job.reply_to, reply_addr=job.reply_addr,
            kv_transfer_params=kv_transfer_params,
            media=job.media if kv_transfer_params is not None else [],
        ), reply_key(self.keys, job))
        return target.info.worker_id
