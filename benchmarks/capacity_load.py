"""The load generator of benchmarks/coordinator_capacity.py, run as a process of its own.

A closed loop: `concurrency` keep-alive HTTP/1.1 connections, each sending its next chat request as soon as
the last one is answered. It speaks HTTP over raw asyncio streams (no client library): on a 2-core machine
it shares the cores with the coordinator it measures, so every microsecond it spends is one the coordinator
does not get; it reports its own CPU time so the reader sees whether it, not the coordinator, was the limit.

Protocol with the parent on stdout: a line "ready" when the measured window starts (connections open,
warm-up done), "end" when it ends (no new request is sent after it), then one JSON line with the results
once every request sent has been answered (or failed).

    python -m benchmarks.capacity_load --port 8000 --concurrency 32 --window-s 5 --max-tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from dataclasses import dataclass, field


@dataclass
class Tally:
    """What the connections saw; times are perf_counter() seconds."""

    done: list[tuple[float, float, int]] = field(default_factory=list)
    """(sent, answered, completion tokens) of each 200."""
    rejected: list[float] = field(default_factory=list)
    """Answer times of each 429."""
    other: dict[str, int] = field(default_factory=dict)
    """Any other status, or the exception a request died of (a lost request)."""


def request_bytes(host: str, port: int, max_tokens: int, stream: bool, api_key: str | None) -> bytes:
    body = {"model": "tiny-llava", "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": "Tell me about the capacity of a coordinator."}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    raw = json.dumps(body).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"{auth}Content-Length: {len(raw)}\r\n\r\n")
    return head.encode() + raw


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, server keeps the connection) of one HTTP/1.1 response (content-length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            parts.append(data[:-2])
        body = b"".join(parts)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, body, headers.get("connection", "").lower() != "close"


def completion_tokens(body: bytes, stream: bool) -> int:
    if not stream:
        return int(json.loads(body)["usage"]["completion_tokens"])
    for line in reversed(body.split(b"\n")):  # the usage chunk is the last before [DONE]
        if line.startswith(b"data: {") and b'"usage":{' in line:
            return int(json.loads(line[6:])["usage"]["completion_tokens"])
    raise ValueError("the stream carried no usage chunk")


async def connection(host: str, port: int, payload: bytes, stream: bool, stop: asyncio.Event, tally: Tally) -> None:
    reader = writer = None
    while not stop.is_set():
        sent = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            writer.write(payload)
            status, body, keep = await read_response(reader)
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            tally.other[type(e).__name__] = tally.other.get(type(e).__name__, 0) + 1
            writer = None
            await asyncio.sleep(0.05)
            continue
        answered = time.perf_counter()
        if status == 200:
            tally.done.append((sent, answered, completion_tokens(body, stream)))
        elif status == 429:
            tally.rejected.append(answered)
        else:
            tally.other[str(status)] = tally.other.get(str(status), 0) + 1
        if not keep:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run(a: argparse.Namespace) -> dict:
    payload = request_bytes(a.host, a.port, a.max_tokens, a.stream, a.api_key)
    stop, tally = asyncio.Event(), Tally()
    tasks = [asyncio.create_task(connection(a.host, a.port, payload, a.stream, stop, tally))
             for _ in range(a.concurrency)]
    await asyncio.sleep(a.warmup_s)
    start, cpu0 = time.perf_counter(), cpu_s()
    print("ready", flush=True)
    await asyncio.sleep(a.window_s)
    end, cpu1 = time.perf_counter(), cpu_s()
    stop.set()
    print("end", flush=True)
    await asyncio.wait_for(asyncio.gather(*tasks), a.drain_timeout_s)
    inside = [(s, t, n) for s, t, n in tally.done if start <= t < end]
    return {"window_s": end - start, "ok": len(inside), "rejected_429": sum(start <= t < end for t in tally.rejected),
            "tokens": sum(n for *_, n in inside), "latencies_s": [t - s for s, t, _ in inside],
            "total_ok": len(tally.done), "total_429": len(tally.rejected), "failed": tally.other,
            "loadgen_cpu_s": cpu1 - cpu0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.capacity_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=16, help="connections, each with one request at a time")
    p.add_argument("--window-s", type=float, default=5.0, help="the measured window")
    p.add_argument("--warmup-s", type=float, default=1.0, help="load before the window, not measured")
    p.add_argument("--drain-timeout-s", type=float, default=60.0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--stream", action="store_true", help="SSE answers (stream: true) instead of JSON")
    p.add_argument("--api-key", default=None)
    a = p.parse_args(argv)
    if a.concurrency < 1 or a.window_s <= 0:
        p.error("--concurrency must be >= 1 and --window-s > 0")
    try:  # a leaner event loop when installed (the coordinator's uvicorn runs on it too)
        import uvloop
        result = uvloop.run(run(a))
    except ImportError:
        result = asyncio.run(run(a))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
