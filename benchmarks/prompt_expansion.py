"""What tokenizing a prompt costs with its media placeholders expanded in text or in ids.

The coordinator used to expand each placeholder to its run (one `<image>` -> 576 of them for LLaVA-1.5, a few
thousand `<|image_pad|>` for a Qwen2-VL high-res image or video) and tokenize that text; `PromptBuilder._tokenize`
now tokenizes the rendered text, one placeholder per item, and repeats the placeholder's id (the same ids:
tests/coordinator/test_prompt_expansion.py). This times both on the shipped tiny checkpoints' tokenizers, for runs
of several sizes, alternating the two, on the coordinator's critical path (`PromptBuilder.build`):

    taskset -c 1 python -m benchmarks.prompt_expansion --out benchmarks/results/prompt_expansion.json
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import sys
import time
from pathlib import Path

from benchmarks.bench.report import write_json
from coordinator.prompt import PromptBuilder

ASSETS = {"tiny-llava": "coordinator/assets/tiny-llava", "tiny-qwen2-vl": "coordinator/assets/tiny-qwen2-vl"}


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(builder: PromptBuilder, run: int, repeats: int) -> dict:
    placeholder = next(iter(builder.view.placeholders.values()))
    text = f"USER: {placeholder}\nWhat is shown here, in a few words? ASSISTANT:"
    pieces = re.split(f"({re.escape(placeholder)})", text)
    runs = [(placeholder, run)]
    in_ids = lambda: builder._tokenize(text, pieces, runs)  # noqa: E731
    if builder._tokenize(text, pieces, runs) != _in_text(builder, text, pieces, runs):
        raise SystemExit("the two ways disagree: tests/coordinator/test_prompt_expansion.py should have caught it")
    ids_ms, text_ms = [], []
    for _ in range(3):  # alternated, so a drift of the host's speed hits both
        ids_ms.append(_median_ms(in_ids, repeats))
        text_ms.append(_median_ms(lambda: _in_text(builder, text, pieces, runs), repeats))
    return {"placeholder_run": run, "expanded_in_text_ms": statistics.median(text_ms),
            "expanded_in_ids_ms": statistics.median(ids_ms),
            "ratio_ids_over_text": statistics.median(ids_ms) / statistics.median(text_ms)}


def _in_text(builder: PromptBuilder, text: str, pieces: list[str], runs: list[tuple[str, int]]) -> list[int]:
    """The old way: the slow path of _tokenize, taken when no placeholder is an added token."""
    added, builder._added = builder._added, {}
    try:
        return builder._tokenize(text, pieces, runs)
    finally:
        builder._added = added


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, nargs="+", default=[196, 576, 2304, 16384],
                   help="placeholder tokens per item to time (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=30, help="calls per median (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the JSON here")
    a = p.parse_args(argv)
    rows = []
    for name, path in ASSETS.items():
        builder = PromptBuilder.from_model_dir(path)
        for run in a.runs:
            row = {"tokenizer": name, **measure(builder, run, a.repeats)}
            rows.append(row)
            print(f"{name:14s} run {run:6d}: in text {row['expanded_in_text_ms']:8.3f} ms, in ids "
                  f"{row['expanded_in_ids_ms']:7.3f} ms (x{row['ratio_ids_over_text']:.2f})")
    doc = {"tool": "benchmarks.prompt_expansion", "command": "python -m benchmarks.prompt_expansion "
           + " ".join(sys.argv[1:] if argv is None else argv), "host": platform.node(),
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
    if a.out:
        write_json(a.out, doc)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
