"""benchmarks/timer_stretch.py: how much of two workers' time-slicing their step timers saw, read from saved runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.timer_stretch import decode_spans, main, overlaps, run_stretch

REPO = Path(__file__).resolve().parents[2]


def _saved(requests: list[tuple[bool, float, float, float, int, float]]) -> dict[str, list]:
    """Saved records from (handed off, sent, decode start after sent, decode end after sent, tokens, step s)."""
    out = {k: [] for k in ("sent", "ttft", "e2e", "output_tokens", "error", "decode_s", "marks")}
    for handed_off, sent, start, end, n, step in requests:
        out["sent"].append(sent)
        out["ttft"].append(start - 0.002 if handed_off else start)
        out["e2e"].append(end)
        out["output_tokens"].append(n)
        out["error"].append(None)
        out["decode_s"].append(step * (n - 1))
        out["marks"].append({"handoff_sent": start - 0.004, "decode_admitted": start} if handed_off else {})
    return out


def test_the_overlap_is_the_share_of_a_decode_the_other_worker_was_decoding():
    saved = _saved([(False, 0.0, 0.0, 1.0, 11, 0.001),   # P+D over [0, 1]
                    (True, 0.0, 0.5, 1.5, 11, 0.001),    # D over [0.5, 1.5]
                    (False, 2.0, 0.0, 1.0, 11, 0.001)])  # P+D over [2, 3], alone
    spans = decode_spans(saved)
    assert [s[0] for s in spans] == ["P+D", "D", "P+D"]
    assert overlaps(spans) == pytest.approx([0.5, 0.5, 0.0])


def test_the_share_seen_is_the_timers_stretch_over_the_walls():
    """Every request's TPOT is 2 ms + 2 ms x overlap and its step timer 1.5 ms + 0.3 ms x overlap: at full overlap the
    wall stretched by 1.0, the timers by 0.2, so they saw 0.2 of it. Each decode-worker request lies inside a
    combined-worker one (overlap 1), which it overlaps for the share that fits the law."""
    import math

    rows, t = [], 0.0
    for _ in range(2):
        rows.append((False, t, 0.0, 0.02, 11, 0.0015))            # alone: 10 tokens at 2 ms
        t += 1.0
        for n_d in (3, 5, 7, 9):
            d_len = 0.004 * (n_d - 1) - 0.002                     # TPOT 4 ms counted from its first token, 2 ms earlier
            share = (-0.02 + math.sqrt(0.02 ** 2 + 4 * 0.02 * d_len)) / (2 * 0.02)   # 0.02 s^2 + 0.02 s = d_len
            length = 10 * (0.002 + 0.002 * share)
            rows.append((False, t, 0.0, length, 11, 0.0015 + 0.0003 * share))
            rows.append((True, t, 0.0, d_len, n_d, 0.0018))
            t += 1.0
    result = run_stretch(_saved(rows))
    assert result["requests"] == len(rows) == 18
    assert result["tpot_ms"] == pytest.approx([2.0, 2.0], abs=1e-3)
    assert result["step_ms"] == pytest.approx([1.5, 0.3], abs=1e-3)
    assert result["seen"] == pytest.approx(0.2, abs=1e-3)


def test_the_saved_quiet_phase_runs_read_as_measured(tmp_path, capsys):
    out = tmp_path / "stretch.json"
    assert main([str(REPO / "benchmarks/results/sim_fidelity_s23/quiet_phase_2.json"), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["runs"]) == 6 and all(0.1 <= r["seen"] <= 0.22 for r in doc["runs"])
    assert "median share of the stretch the timers saw" in capsys.readouterr().out


def test_records_without_the_layout_are_refused(tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"layouts": [{"layout": "epd", "cells": []}]}))
    with pytest.raises(SystemExit) as e:
        main([str(path)])
    assert e.value.code == 2 and "no colocated_prefill layout" in capsys.readouterr().err
