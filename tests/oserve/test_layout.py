"""Layouts as planned GPUs: what `tierserve up` starts, the diff between two layouts, fresh process names."""

from __future__ import annotations

from coordinator.oserve.layout import Namer, Unit, diff, local_units


def test_local_units_name_the_processes_tierserve_up_starts():
    units = local_units(2, [frozenset({"prefill"}), frozenset({"steal"})], ["combined", "decode"])
    assert units == [Unit(role="E+P", workers=("encode-0", "llm-local-0")),
                     Unit(role="E", workers=("encode-1", "llm-steal-1")),
                     Unit(role="P+D", workers=("llm-0-combined",)), Unit(role="D", workers=("llm-1-decode",))]


def test_diff_keeps_shared_roles_starts_the_new_and_retires_the_rest():
    current = local_units(1, [frozenset()], ["combined"])
    d = diff(current, ["E", "E", "P", "D"])
    assert [u.role for u in d.keep] == ["E"] and sorted(d.start) == ["D", "E", "P"]
    assert [u.workers for u in d.retire] == [("llm-0-combined",)]
    assert d.describe() == "start 1 D, 1 E, 1 P; retire 1 P+D; keep 1 E"
    assert diff(current, ["P+D", "E"]).empty


def test_new_names_never_reuse_one_in_use():
    namer = Namer({"encode-0", "llm-0-combined", "llm-local-1"})
    assert namer.unit("E") == [("encode-2", "encode", None)]  # encode-1's GPU slot has a local prefill name
    assert namer.unit("E+P") == [("encode-3", "encode", None), ("llm-local-3", "prefill", "encode-3")]
    assert namer.unit("P") == [("llm-1-prefill", "prefill", None)]
    assert namer.unit("D") == [("llm-2-decode", "decode", None)]
