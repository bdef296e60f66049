"""The pack's short markdown summary: the figures the closing note quotes, read from pack.json's dict."""

from __future__ import annotations

from typing import Any


def _fmt(x: Any, spec: str = ".3g") -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def _problem(step: Any) -> str | None:
    if not isinstance(step, dict):
        return "missing"
    return step.get("error") or step.get("skipped")


def _section(lines: list[str], title: str, step: Any) -> bool:
    """Append the section's title (and why it is empty); True when the step has results to list."""
    lines += ["", f"## {title}"]
    why = _problem(step)
    if why is not None:
        lines.append(f"not measured: {why}")
    return why is None


def summary_markdown(r: dict[str, Any]) -> str:
    lines = [f"# GPU pack on {r.get('gpu')} ({r.get('device')})", "",
             f"`{r.get('command')}`, {r.get('measured_at')}, torch {r.get('torch')} CUDA {r.get('cuda')}, "
             f"{r.get('wall_s')} s in all.", ""]
    ex = r.get("exactness")
    if _section(lines, "a. Exactness (tiny LLaVA: encode -> transport -> prefill -> KV -> decode)", ex):
        lines.append(f"all within tolerance: **{ex['ok']}** (float32 logits atol {ex['fp32_atol']}, bfloat16 "
                     f"{ex['bf16_atol']} while tokens agree)")
        for dtype in ("float32", "bfloat16"):
            for row in ex.get(dtype, []):
                lines.append(f"- {dtype} {row['case']!r}: {row['agreeing_prefix']}/{len(row['reference_tokens'])} "
                             f"tokens equal to generate(); problems: {row['problems'] or 'none'}")
    lines += ["", "## b. Encoder C_E(B), bf16, random weights", "", "| model | B | s/batch | items/s |", "|---|---|---|---|"]
    for kind in ("llava-1.5-7b", "qwen2-vl-7b"):
        c = r.get(f"encoder_{kind}")
        if (why := _problem(c)) is not None:
            lines.append(f"| {kind} | - | {why} | - |")
            continue
        for p in c["points"]:
            lines.append(f"| {kind} | {p['batch']} | {_fmt(p['seconds'])} | {_fmt(p['items_per_s'], '.1f')} |")
        lines.append(f"| {kind} | gain at B=8 vs B=1 | {_fmt(c.get('batching_gain_at_8'), '.2f')}x | |")
    sm = r.get("smpartition")
    if _section(lines, "c. SM partitioning (benchmarks/gpu/smpartition.py)", sm):
        lines.append(f"exit code {sm['exit_code']}; ratios per backend:")
        for backend, res in (sm.get("result", {}).get("backends") or {}).items():
            lines.append(f"- {backend}: {res.get('ratios') if isinstance(res, dict) else res}")
    llm = r.get("llm")
    if _section(lines, "d. LLaVA-1.5-7B-sized language model, bf16, reference engine forwards", llm):
        for p in llm["prefill"]:
            lines.append(f"- prefill {p['tokens']} tokens: {_fmt(p['seconds'])} s ({_fmt(p['tokens_per_s'], '.0f')} tok/s)")
        for p in llm["decode"]:
            lines.append(f"- decode batch {p['batch']} at {llm['context_per_sequence']} ctx: {_fmt(p['seconds'])} s/step "
                         f"({_fmt(p['tokens_per_s'], '.0f')} tok/s)")
    nv = r.get("nvml", {})
    samples = nv.get("samples", [])
    lines += ["", "## e. NVML", f"{nv.get('reason')}; {len(samples)} samples"]
    for key in ("gpu_util_pct", "gpu_power_w", "gpu_mem_used_bytes", "gpu_sm_clock_mhz", "gpu_temp_c"):
        vals = [s[key] for s in samples if key in s]
        if vals:
            lines.append(f"- {key}: max {_fmt(max(vals))}, mean {_fmt(sum(vals) / len(vals))}")
    return "\n".join(lines) + "\n"
