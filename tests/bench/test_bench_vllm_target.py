"""The peer targets of `tierserve bench`: `vllm` (plain vLLM started for the run) and `local-vllm` (a tierserve
cluster whose LLM workers run the vLLM engine), parsed and built as the run uses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench.targets import LocalOptions, TargetError, local_spec, parse_target
from benchmarks.bench.vllm_server import vllm_command


def test_peer_targets_parse():
    assert parse_target("vllm").kind == "vllm"
    local = parse_target("ts=local-vllm")
    assert (local.kind, local.engine, local.label) == ("local", "vllm", "ts")
    assert parse_target("local").engine == "reference"
    with pytest.raises(TargetError, match="local-vllm"):
        parse_target("vllm-ish")


def test_local_vllm_cluster_runs_its_llm_workers_on_vllm():
    assert local_spec([], LocalOptions(), "vllm").llm_args == ["--engine", "vllm"]
    assert local_spec([], LocalOptions()).llm_args == []


def test_plain_vllm_is_monolithic_fp32_on_the_same_model():
    cmd = vllm_command(Path("/models/tiny-llava"), 8123, kv_cache_mib=64, served_name="tiny-llava")
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    flags = {flag: value for flag, value in zip(cmd, [*cmd[1:], ""]) if flag.startswith("--")}
    assert flags["--model"] == "/models/tiny-llava" and flags["--served-model-name"] == "tiny-llava"
    assert flags["--dtype"] == "float32" and flags["--kv-cache-memory-bytes"] == str(64 << 20)
    assert "--enforce-eager" in cmd
