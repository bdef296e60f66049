"""`--goodput ttft:MS tpot:MS [e2el:MS]`: what parses (bare numbers are milliseconds, units allowed), what is
refused and why; and the bench's seconds flags (--timeout, --duration), which refuse a bare number."""

from __future__ import annotations

import pytest

from benchmarks.bench.args import build_parser
from benchmarks.bench.slo import SLO, SLOError, parse_goodput


@pytest.mark.parametrize("items,expected", [
    (["ttft:500", "tpot:50"], SLO(ttft_ms=500, tpot_ms=50)),
    (["tpot:50", "ttft:500", "e2el:4000"], SLO(ttft_ms=500, tpot_ms=50, e2el_ms=4000)),
    (["ttft:500,tpot:50"], SLO(ttft_ms=500, tpot_ms=50)),
    (["TTFT=0.5", "tpot:12.5ms"], SLO(ttft_ms=0.5, tpot_ms=12.5)),
    (["ttft:2s", "tpot:100ms", "e2el:1min"], SLO(ttft_ms=2000, tpot_ms=100, e2el_ms=60000)),
    (["ttft:2000us,tpot:1e2"], SLO(ttft_ms=2, tpot_ms=100)),
])
def test_good_strings(items, expected):
    assert parse_goodput(items) == expected


@pytest.mark.parametrize("items,needle", [
    (["ttft:500"], "missing: tpot"),
    (["tpot:50"], "missing: ttft"),
    (["ttft:abc", "tpot:5"], "not a number of milliseconds or a number with a unit"),
    (["ttft:2parsecs", "tpot:5"], "cannot read ttft='2parsecs'"),
    (["ttft:2m", "tpot:5"], "us, ms, s, min"),  # m: milli or minutes? neither
    (["ttft:0", "tpot:5"], "finite, positive"),
    (["ttft:-1", "tpot:5"], "finite, positive"),
    (["ttft:inf", "tpot:5"], "finite"),
    (["ttft:nan", "tpot:5"], "finite"),
    (["ttft:5", "tpot:5", "ttft:6"], "twice"),
    (["itl:5", "ttft:1", "tpot:1"], "unknown metric"),
    (["ttft500", "tpot:5"], "not KEY=TIME"),
    (["ttft:500", "tpot:50", "e2el:100"], "no request could meet it"),
])
def test_impossible_strings_are_refused_with_the_form(items, needle):
    with pytest.raises(SLOError, match=needle):
        parse_goodput(items)


def test_a_request_must_meet_every_target():
    slo = SLO(ttft_ms=500, tpot_ms=50, e2el_ms=2000)
    assert slo.met(0.5, 0.05, 2.0)  # on the boundary counts
    assert not slo.met(0.501, 0.01, 1.0)
    assert not slo.met(0.1, 0.0501, 1.0)
    assert not slo.met(0.1, 0.01, 2.001)
    assert slo.met(0.1, None, 0.2)  # a 1-token answer has no TPOT
    assert not slo.met(None, None, None)  # never produced a token
    assert SLO(ttft_ms=1, tpot_ms=1).met(0.001, 0.001, 99.0)  # no e2el target


@pytest.mark.parametrize("flag,value,seconds", [("--timeout", "300s", 300.0), ("--timeout", "5min", 300.0),
                                                ("--duration", "1500ms", 1.5)])
def test_seconds_flags_read_units(flag, value, seconds):
    a = build_parser("").parse_args(["--goodput", "ttft:1", "tpot:1", flag, value])
    assert getattr(a, flag[2:]) == pytest.approx(seconds)


@pytest.mark.parametrize("flag", ["--timeout", "--duration"])
def test_seconds_flags_refuse_a_bare_number_with_the_units(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser("").parse_args([flag, "300"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag}='300' has no unit" in err and "300s" in err and "us, ms, s, min" in err
