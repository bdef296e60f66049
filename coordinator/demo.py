"""`tierserve demo`: bring up the local cluster, send a few image+text requests, print the answers."""

from __future__ import annotations

import base64
import io
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from PIL import Image, ImageDraw
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

PROMPTS = [
    "What is in this image?",
    "Describe the colors and shapes.",
    "Is this picture taken indoors or outdoors?",
    "Tell me about the object in the center.",
    "How many shapes are there?",
    "Describe this image briefly.",
]
COLORS = ["red", "green", "blue", "yellow", "white", "purple"]


def demo_image(i: int) -> bytes:
    """A small picture that differs per request, so the answers do too."""
    im = Image.new("RGB", (160 + 16 * i, 120), COLORS[i % len(COLORS)])
    d = ImageDraw.Draw(im)
    d.ellipse((10 + 5 * i, 10, 80 + 5 * i, 80), fill=COLORS[(i + 2) % len(COLORS)])
    d.rectangle((90, 30 + 3 * i, 150, 100), fill=COLORS[(i + 4) % len(COLORS)])
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


@dataclass
class Answer:
    prompt: str
    text: str
    ttft_s: float
    tpot_s: float
    tokens: int


def ask(base_url: str, model: str, prompt: str, png: bytes, max_tokens: int) -> Answer:
    """One streaming request; TTFT and TPOT measured here, at the client."""
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(png)}}, {"type": "text", "text": prompt}]}]}
    t0 = time.perf_counter()
    stamps, text, tokens = [], [], 0
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode()}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                if c["delta"].get("content"):
                    stamps.append(time.perf_counter())
                    text.append(c["delta"]["content"])
    ttft = (stamps[0] - t0) if stamps else float("nan")
    tpot = (stamps[-1] - stamps[0]) / max(1, tokens - 1) if stamps else float("nan")
    return Answer(prompt, "".join(text), ttft, tpot, tokens)


def run_demo(base_url: str, model: str, n: int, max_tokens: int, concurrency: int, console: Console) -> list[Answer]:
    jobs = [(PROMPTS[i % len(PROMPTS)], demo_image(i)) for i in range(n)]
    answers: list[Answer | None] = [None] * n
    with Progress(console=console, transient=True) as progress, ThreadPoolExecutor(concurrency) as pool:
        task = progress.add_task("requests", total=n)
        futs = {pool.submit(ask, base_url, model, p, png, max_tokens): i for i, (p, png) in enumerate(jobs)}
        for fut, i in futs.items():
            answers[i] = fut.result()
            progress.advance(task)
    table = Table(title=f"{n} image+text requests via {base_url}")
    for col in ("#", "prompt", "answer", "tokens", "TTFT ms", "TPOT ms"):
        table.add_column(col, overflow="fold")
    for i, a in enumerate(answers):
        table.add_row(str(i), a.prompt, repr(a.text), str(a.tokens), f"{a.ttft_s * 1e3:.0f}", f"{a.tpot_s * 1e3:.1f}")
    console.print(table)
    console.print("[dim]The tiny default model has random weights: answers are gibberish by design; "
                  "pass --model PATH for real weights.[/dim]")
    return answers  # type: ignore[return-value]
