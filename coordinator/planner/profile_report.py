"""What `tierserve profile` shows: a progress bar while measuring, then the profile as rich tables."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from coordinator.planner.profile import Profile
from coordinator.planner.profiling import ProfileOutcome
from coordinator.planner.profiling_phases import Tick


@contextmanager
def profile_progress(console: Console, total: int) -> Iterator[Tick]:
    """A bar over the planned measurements; points skipped by early stops tick off at once."""
    progress = Progress(TextColumn("[bold]profiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console)
    task = progress.add_task("profiling", total=total)
    with progress:
        yield lambda n: progress.advance(task, n)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def print_profile(console: Console, outcome: ProfileOutcome, path: Path) -> None:
    p = outcome.profile
    console.print(f"[bold]{p.model}[/] on tier [bold]{p.tier}[/], measured {p.measured_at}")
    for modality, curve in p.encode.items():
        t = Table(title=f"encode ({modality}, {curve.tokens_per_item} tokens per item)")
        for col in ("B", "ms per batch", "items/s"):
            t.add_column(col, justify="right")
        for e in curve.points:
            t.add_row(str(e.batch), _ms(e.seconds), f"{e.batch / e.seconds:.1f}")
        console.print(t)
    t = Table(title="prefill (one prompt per step)")
    for col in ("prompt tokens", "ms", "tokens/s"):
        t.add_column(col, justify="right")
    for pp in p.prefill:
        t.add_row(str(pp.tokens), _ms(pp.seconds), f"{pp.tokens / pp.seconds:.0f}")
    console.print(t)
    t = Table(title="decode (one step)")
    for col in ("batch", "context tokens", "ms per step", "tokens/s"):
        t.add_column(col, justify="right")
    for d in p.decode:
        t.add_row(str(d.batch), str(d.context_tokens), _ms(d.seconds), f"{d.batch / d.seconds:.0f}")
    console.print(t)
    _print_overheads(console, p)
    if p.stage1 is not None:
        s = p.stage1
        capped = " (the worker's batch cap)" if s.encode_batch_capped else ""
        console.print(f"stage 1: C_E {s.encode_items_per_s:.1f} items/s at B={s.encode_batch}{capped}; prefill "
                      f"{s.prefill_tokens_per_s:.0f} tokens/s; decode {s.decode_tokens_per_s:.0f} tokens/s at "
                      f"batch {s.decode_batch}")
    for note in outcome.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    console.print(f"source: {p.source}", highlight=False)
    console.print(f"wrote {path}")


def _print_overheads(console: Console, p: Profile) -> None:
    o = p.overheads
    if o is None:
        return
    console.print(f"overheads (ms): encode {_ms(o.encode_batch_s)} per batch + {_ms(o.encode_request_s)} per request; "
                  f"prefill step {_ms(o.prefill_step_s)}; decode step {_ms(o.decode_step_s)} + {_ms(o.decode_seq_s)} "
                  f"per sequence; admission {_ms(o.admit_s)} per join to a running batch; hop {_ms(o.hop_s)}; "
                  f"KV hand-off {_ms(o.kv_hop_s) if o.kv_hop_s is not None else 'not measured (--kv-handoff-url)'}; "
                  f"request latency {_ms(o.request_latency_s)}")
    if o.shared_cores:
        console.print(f"serving stack CPU (ms): {_ms(o.stack_cpu_request_s)} per request + {_ms(o.stack_cpu_token_s)} "
                      f"per token, on {o.shared_cores} cores shared with the workers")
