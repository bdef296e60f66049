"""`--dataset FILE.jsonl`: recorded requests to replay instead of synthetic ones.

One JSON object per line (blank lines and lines starting with # are skipped). Each object has exactly
one of:

  "prompt":   text of a single user turn, optionally with media:
              "images": [IMAGE, ...]  each a path (relative to the dataset file's folder), a data: URL
                                      or an http(s) URL (sent as is; the server must be able to fetch it)
              "audio":  PATH          a WAV or MP3 file, sent as an OpenAI `input_audio` part
  "messages": a whole OpenAI chat `messages` list, sent unchanged

and may add:

  "output_tokens": N     max_tokens of the request (default: drawn from --output-tokens)
  "timestamp": SECONDS   arrival offset from the start of the trace; replayed with --request-rate trace

Example:
  {"prompt": "What is in this image?", "images": ["imgs/cat.jpg"], "output_tokens": 64, "timestamp": 0.0}
  {"prompt": "Summarise the clip.", "audio": "clips/a.wav", "timestamp": 0.42}
  {"messages": [{"role": "user", "content": "Hello"}], "output_tokens": 16}

Files are read here and sent inline as data URLs, so the server needs no access to the client's disk.
Any malformed line stops the run before it starts, with the file, line number and reason.
"""

from __future__ import annotations

import base64
import json
import mimetypes
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench.media import data_url
from benchmarks.bench.workload import Length, RequestSpec

KEYS = {"prompt", "images", "audio", "messages", "output_tokens", "timestamp"}


class DatasetError(ValueError):
    """A dataset file that cannot be replayed; the message names the file and line."""


def _image_url(item: Any, base: Path, where: str) -> str:
    if not isinstance(item, str) or not item:
        raise DatasetError(f"{where}: each entry of \"images\" must be a non-empty string (path or URL)")
    if item.startswith(("data:", "http://", "https://")):
        return item
    path = Path(item) if Path(item).is_absolute() else base / item
    if not path.is_file():
        raise DatasetError(f"{where}: image file {item!r} not found (looked at {path})")
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    return data_url(path.read_bytes(), mime)


def _audio_part(item: Any, base: Path, where: str) -> dict[str, Any]:
    if not isinstance(item, str):
        raise DatasetError(f"{where}: \"audio\" must be a path to a .wav or .mp3 file")
    path = Path(item) if Path(item).is_absolute() else base / item
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("wav", "mp3"):
        raise DatasetError(f"{where}: audio {item!r} must be a .wav or .mp3 file")
    if not path.is_file():
        raise DatasetError(f"{where}: audio file {item!r} not found (looked at {path})")
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(path.read_bytes()).decode(), "format": fmt}}


def _entry(obj: Any, base: Path, where: str) -> RequestSpec:
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - KEYS)
    if unknown:
        raise DatasetError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(KEYS)}")
    if ("prompt" in obj) == ("messages" in obj):
        raise DatasetError(f"{where}: give exactly one of \"prompt\" or \"messages\"")
    out = obj.get("output_tokens")
    if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
        raise DatasetError(f"{where}: \"output_tokens\" must be an integer >= 1, got {out!r}")
    ts = obj.get("timestamp")
    if ts is not None and (not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0):
        raise DatasetError(f"{where}: \"timestamp\" must be a number of seconds >= 0, got {ts!r}")
    meta: dict[str, Any] = {"source": where}
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
            raise DatasetError(f"{where}: \"messages\" must be a non-empty list of {{\"role\": ..., \"content\": ...}}")
        if "images" in obj or "audio" in obj:
            raise DatasetError(f"{where}: put media inside \"messages\" when you give messages")
        meta["modality"] = "messages"
        return RequestSpec(index=-1, content=None, messages=msgs, max_tokens=out or 0, meta=meta, timestamp=ts)
    if not isinstance(obj["prompt"], str):
        raise DatasetError(f"{where}: \"prompt\" must be a string")
    images = obj.get("images", [])
    if not isinstance(images, list):
        raise DatasetError(f"{where}: \"images\" must be a list")
    parts = [{"type": "image_url", "image_url": {"url": _image_url(im, base, where)}} for im in images]
    if "audio" in obj:
        parts.append(_audio_part(obj["audio"], base, where))
    parts.append({"type": "text", "text": obj["prompt"]})
    meta |= {"modality": "audio" if "audio" in obj else "image" if images else "text", "images": len(images)}
    return RequestSpec(index=-1, content=parts, max_tokens=out or 0, meta=meta, timestamp=ts)


def load_dataset(path: Path) -> list[RequestSpec]:
    """Every request of the file, validated; max_tokens 0 where the line left it to --output-tokens."""
    if not path.is_file():
        raise DatasetError(f"--dataset {path}: no such file")
    specs = []
    with path.open(encoding="utf-8", errors="strict") as f:
        try:
            lines = list(f)
        except UnicodeDecodeError as e:
            raise DatasetError(f"{path}: not UTF-8 text ({e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        specs.append(_entry(obj, path.parent, where))
    if not specs:
        raise DatasetError(f"{path}: no requests in the file")
    return specs


def take(specs: list[RequestSpec], n: int, output_tokens: Length, seed: int) -> list[RequestSpec]:
    """The first n requests (cycling through the file when n exceeds it), numbered, with max_tokens
    drawn from --output-tokens where the file gave none."""
    rng = np.random.default_rng([seed, 2])
    drawn = output_tokens.sample(rng, n)
    out = []
    for i in range(n):
        s = specs[i % len(specs)]
        out.append(RequestSpec(index=i, content=s.content, messages=s.messages, max_tokens=s.max_tokens or int(drawn[i]),
                               meta=s.meta, timestamp=s.timestamp))
    return out
