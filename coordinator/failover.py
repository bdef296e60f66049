"""Failure detection and re-runs, on the coordinator (which holds every in-flight request's state).

Every `interval_s` one task reads the registry. A request whose holder (the worker process it was last
handed to) has left it — its heartbeat lapsed (dead, or hung), it stopped, or a new instance of the same id
replaced it — is re-run: attempt + 1, sent again from its first stage (the embeddings and KV cache died with
the worker), continuing after the tokens its client already has, at most `migration_limit` times. Where no
re-run is possible the client gets an explicit error within a few seconds. Dead workers are reaped (index
entry, job stream, dispatch queues). Redis losing its contents (restart without persistence, FLUSHALL) is
seen by the epoch key vanishing: requests in flight then fail with a clear error and serving goes on as
workers re-register.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from redis.exceptions import RedisError

from coordinator.errors import RequestError
from coordinator.flights import Flight
from coordinator.protocol.aborts import abort_message
from coordinator.protocol.process import cancel_and_wait, honour_cancel
from coordinator.state import AppState
from coordinator.submit import dispatch_soon

log = logging.getLogger(__name__)
REDIS_DOWN_FAIL_S = 3.0
"""Redis unreachable this long: nothing can progress, so the requests in flight get an explicit error."""


class Failover:
    def __init__(self, state: AppState, interval_s: float = 0.25) -> None:
        self.state = state
        self.interval_s = interval_s
        self.epoch = uuid.uuid4().hex
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        s = self.state
        await s.redis.set(s.keys.epoch, self.epoch, nx=True)

    async def run(self) -> None:
        down_since: float | None = None
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
                if down_since is not None:
                    log.info("failover check works again")
                down_since = None
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as e:
                honour_cancel()
                now = time.monotonic()
                if down_since is None:
                    log.warning("failover check cannot reach Redis; retrying", extra={"error": str(e)})
                    down_since = now
                elif now - down_since > REDIS_DOWN_FAIL_S:
                    self.fail_all(f"the cluster's Redis has been unreachable for over {REDIS_DOWN_FAIL_S:.0f} s "
                                  "while this request ran; retry it")
            except Exception:  # a bug here must not end failure detection for the coordinator's life
                honour_cancel()
                log.exception("failover check failed")

    def fail_all(self, message: str) -> None:
        for f in self.state.flights:
            if not f.done:
                f.fail(message)
                self.state.metrics.reruns.labels("redis_lost").inc()

    async def check(self) -> None:
        s = self.state
        seen_at = time.monotonic()
        if not await s.redis.exists(s.keys.epoch):
            await self.redis_lost()
            return
        live, lapsed = await s.registry.scan()
        instances = {w.info.worker_id: w.info.instance for w in live}
        for worker_id in lapsed:
            s.dispatcher.forget(worker_id)
            if await s.registry.reap(worker_id):
                log.warning("worker gone: reaped its registry entry and job stream", extra={"worker_id": worker_id})
        for flight in s.flights:
            h = flight.holder
            if h is None or flight.done or flight.rerunning or flight.prompt_key is not None:
                continue  # no holder yet, over, already re-running, or its prompt not built (a re-run needs it)
            if not flight.gap_overdue(seen_at) and (flight.holder_since >= seen_at or
                                                    instances.get(h.worker_id) == h.instance):
                continue
            flight.rerunning = True
            self._spawn(self.rerun(flight))

    async def redis_lost(self) -> None:
        s = self.state
        flights = [f for f in s.flights if not f.done]
        log.error("Redis lost its contents (restarted without persistence, or flushed); failing the requests "
                  "in flight", extra={"requests": len(flights)})
        self.fail_all("the cluster's Redis lost its state (restart or flush) while this request ran; retry it")
        s.dispatcher.forget_all()
        await s.redis.set(s.keys.epoch, self.epoch, nx=True)
        await s.redis.set(s.keys.policy, s.policy.model_dump_json())

    async def rerun(self, flight: Flight) -> None:
        s = self.state
        lost = flight.holder.worker_id if flight.holder else "?"
        why = "lost some of its tokens" if flight.broken else f"lost worker {lost}"
        try:
            flight.lost_holders.append(lost)
            flight.restart()
            if flight.attempt >= s.config.migration_limit:
                s.metrics.reruns.labels("limit").inc()
                flight.fail(f"the workers holding this request died {flight.attempt + 1} times "
                            f"({', '.join(flight.lost_holders)}); the re-run limit is {s.config.migration_limit}"
                            " (--migration-limit); retry it")
                return
            flight.attempt += 1  # from here on, what the old run still publishes is ignored
            log.warning(f"re-running a request that {why}", extra={
                "request_id": flight.request_id, "holder": lost, "attempt": flight.attempt,
                "tokens_so_far": len(flight.output_token_ids)})
            await s.redis.publish(s.keys.aborts, abort_message(flight.request_id, flight.attempt - 1))
            if flight.media:
                pipe = s.redis.pipeline(transaction=False)
                for ref in flight.media:
                    pipe.expire(ref.key, s.config.media_ttl_s)
                renewed = await pipe.execute()
                if not all(renewed):
                    flight.fail(f"this request {why} and its media have expired, so it cannot re-run; retry it")
                    return
            await dispatch_soon(s, flight)
            s.metrics.reruns.labels("rerun").inc()
        except RequestError as e:
            s.metrics.reruns.labels("no_worker").inc()
            flight.fail(f"this request {why} and no other worker can take it: {e.message}")
        except (RedisError, OSError) as e:
            flight.fail(f"this request {why} and Redis could not take the re-run ({e}); retry it")
        finally:
            flight.rerunning = False

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        await cancel_and_wait(list(self._tasks))
