"""`tierserve profile`: bad input and unsuitable clusters exit 2 with a message, never a traceback; a
quick profile of a live cluster writes a profile the performance model loads."""

from __future__ import annotations

import pytest

from coordinator.cli import main
from coordinator.planner.cli import parse_counts
from coordinator.planner.profile import Profile


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = main(["profile", *args])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())  # rich wraps lines at the terminal width


def test_parse_counts():
    assert parse_counts("1, 2,4", "--x") == (1, 2, 4)
    for bad in ("", "a,2", "0,1", "-3"):
        with pytest.raises(ValueError, match=r"--x must be a comma list of positive integers"):
            parse_counts(bad, "--x")


def test_help_lists_the_measurements(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0 and "doubles until throughput saturates" in out and "--decode-batches" in out


@pytest.mark.parametrize("args,message", [
    (["--prompt-lengths", "32,x"], "--prompt-lengths must be a comma list of positive integers"),
    (["--prompt-lengths", "32,4000"], "--prompt-lengths [4000] exceed --max-prompt-tokens 2040"),
    (["--output-tokens", "1"], "--output-tokens must be at least 2"),
    (["--repeats", "0"], "--repeats must be at least 1, got 0"),
    (["--tier", "TPU-v9"], "unknown GPU tier 'TPU-v9'"),
    (["--url", "http://127.0.0.1:9"], "cannot reach the coordinator at http://127.0.0.1:9/v1/models"),
])
def test_bad_input_exits_2_with_the_reason(capsys, args, message):
    code, out = run_cli(capsys, *args, *([] if "--url" in args else ["--url", "http://127.0.0.1:9"]))
    assert code == 2 and message in out and "Traceback" not in out


@pytest.mark.slow
@pytest.mark.redis
def test_profile_a_live_cluster_by_url(capsys, live_cluster, tmp_path):
    out_file = tmp_path / "profiles" / "cpu.json"
    code, out = run_cli(capsys, "--url", live_cluster.url, "--out", str(out_file), "--repeats", "1",
                        "--max-encode-batch", "1", "--prompt-lengths", "64", "--decode-batches", "1",
                        "--decode-prompts", "40", "--output-tokens", "3")
    assert code == 0, out
    assert "tiny-llava on tier cpu" in out and f"wrote {out_file}" in out and "request latency" in out
    assert "KV hand-off not measured (--kv-handoff-url)" in out
    p = Profile.load(out_file)
    assert [e.batch for e in p.encode["image"].points] == [1] and [x.tokens for x in p.prefill] == [64]
    assert p.overheads.shared_cores == 0          # a cluster given by URL: its stack's CPU is not measured


def test_an_unreachable_kv_handoff_cluster_exits_2_before_profiling(capsys):
    code, out = run_cli(capsys, "--url", "http://127.0.0.1:9", "--kv-handoff-url", "http://127.0.0.1:9")
    assert code == 2 and "cannot reach the coordinator at http://127.0.0.1:9/v1/cluster" in out
    assert "Traceback" not in out


@pytest.mark.slow
@pytest.mark.redis
def test_a_kv_handoff_cluster_without_a_decode_worker_is_refused(capsys, live_cluster):
    code, out = run_cli(capsys, "--url", live_cluster.url, "--kv-handoff-url", live_cluster.url)
    assert code == 2 and "timing the KV hand-off needs a decode worker" in out and "--llm prefill,decode" in out


def test_a_cluster_that_is_not_one_encode_plus_one_combined_is_refused(capsys, monkeypatch):
    async def workers(client, path):
        if path == "/v1/models":
            return {"data": [{"id": "tiny-llava"}]}
        return {"workers": [{"role": "encode", "tier": "cpu"}, {"role": "prefill", "tier": "cpu"},
                            {"role": "decode", "tier": "cpu"}]}

    monkeypatch.setattr("coordinator.planner.profiling.get_json", workers)
    monkeypatch.setattr("coordinator.planner.live_http.get_json", workers)
    code, out = run_cli(capsys, "--url", "http://127.0.0.1:9")
    assert code == 2 and "exactly one encode worker and one combined LLM worker" in out
    assert "['decode', 'encode', 'prefill']" in out and "tierserve up --encode 1 --llm combined" in out
