"""Prefill role: ship a request's KV cache to a decode worker and tell it to continue."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from redis.asyncio import Redis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import DecodeJob, PrefillJob
from coordinator.protocol.registry import WorkerRegistry, least_loaded
from coordinator.protocol.streams import push_job
from transport.base import EmbeddingSender


class HandoffError(RuntimeError):
    """The request cannot continue on a decode worker; the message says why."""


class KVHandoff:
    def __init__(self, redis: Redis, keys: Keys, registry: WorkerRegistry, sender: EmbeddingSender):
        self.redis, self.keys, self.registry, self.sender = redis, keys, registry, sender
        self._rr = 0

    async def send(self, job: PrefillJob, output_token_ids: list[int], kv: torch.Tensor,
                   aborted: Callable[[str], bool], rope_delta: int = 0) -> str | None:
        """Returns the decode worker's id, or None if the request was aborted meanwhile. `rope_delta`
        (M-RoPE) travels with the KV cache: the decode worker cannot recompute it without the media."""
        self._rr += 1
        target = least_loaded(await self.registry.alive(frozenset({"decode"})), self._rr)
        if target is None:
            raise HandoffError("no decode worker is alive for the KV handoff; start one (tierserve up --llm prefill,decode)")
        if aborted(job.request_id):
            return None
        t0 = time.perf_counter()
        try:
            descs = await self.sender.send(target.info.transport_address, job.request_id, {"kv": kv})
        except Exception as e:
            raise HandoffError(f"KV handoff to {target.info.worker_id} failed: {e}") from e
        if aborted(job.request_id):  # the decode worker drops the tensors when it hears of the abort
            return None
        timing = job.timing.mark("handoff_sent", transfer_s=job.timing.transfer_s + time.perf_counter() - t0)
        await push_job(self.redis, self.keys, target.info.worker_id, DecodeJob(
            request_id=job.request_id, prompt_token_ids=job.prompt_token_ids, sampling=job.sampling,
            arrival=job.arrival, timing=timing, output_token_ids=output_token_ids, kv=descs,
            rope_delta=rope_delta,
        ))
        return target.info.worker_id
