"""`tierserve bench` on bad input: a clear message and a non-zero exit, never a traceback; and the
pure pieces of the command line (systems, local cluster layout, presets)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.bench.cli import main
from benchmarks.bench.presets import PRESETS, PresetError, missing_workers, parse_presets
from benchmarks.bench.targets import LocalOptions, TargetError, local_spec, parse_target


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.bench", *args], check=False, capture_output=True, text=True,
                          timeout=120)


class _Handler(BaseHTTPRequestHandler):
    """GET /v1/models as an OpenAI server would; chat completions as a plain web page (mode "html"), as
    JSON despite stream:true (mode "json"), or as a proper OpenAI stream (mode "sse": a foreign server
    with no tierserve admin API); every other path an HTML page."""

    mode = "html"

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models" and self.mode != "html":
            self._send(200, "application/json", json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())
        else:
            self._send(200, "text/html", b"<html>hello</html>")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if self.mode != "sse":
            self._send(200, "application/json", b'{"answer": 42}')
            return
        n = int(body.get("max_tokens") or 4)   # an OpenAI streaming answer of exactly max_tokens words
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
        chunks += [{"choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]} for i in range(n)]
        chunks += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                   {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}}]
        payload = "".join(f"data: {json.dumps({'id': 'c', 'object': 'chat.completion.chunk', 'model': 'm', **c})}\n\n"
                          for c in chunks) + "data: [DONE]\n\n"
        self._send(200, "text/event-stream", payload.encode())

    def log_message(self, *args):
        pass


@pytest.fixture(params=["html", "json"])
def fake_server(request):
    handler = type("H", (_Handler,), {"mode": request.param})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield request.param, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_unreachable_target_exits_2_without_traceback(tmp_path):
    r = bench("--target", "http://127.0.0.1:9", "--num-requests", "2", "--out", str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot reach http://127.0.0.1:9" in r.stdout and "Traceback" not in r.stdout + r.stderr
    assert not (tmp_path / "bench.json").exists()


def test_non_openai_server_is_named_as_such(fake_server, tmp_path, capsys):
    mode, url = fake_server
    assert main(["--target", url, "--num-requests", "2", "--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    if mode == "html":
        assert "not an OpenAI-compatible server" in out and "/v1/models" in out
    else:
        assert "every warm-up request failed (bad_response" in out and "text/event-stream" in out


def _serve(mode: str):
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Handler,), {"mode": mode}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


README_ARGS = ["--preset", "passthrough-epd,tierserve", "--sweep-rate", "2,4,8", "--num-requests", "4",
               "--output-tokens", "4", "--goodput", "ttft:1000", "tpot:100", "--gpus", "1xRTX4090,1xA100", "--seed", "0",
               "--quiet", "--no-plots"]
"""benchmarks/results/bench/README.md's command with --target local swapped for a URL (and fewer requests)."""


def test_the_readme_command_runs_unchanged_against_a_foreign_server(tmp_path, capsys):
    server, url = _serve("sse")
    try:
        assert main(["--target", url, *README_ARGS, "--out", str(tmp_path)]) == 0
    finally:
        server.shutdown()
    out = capsys.readouterr()
    assert "is not a tierserve coordinator" in out.out + out.err and "measured once" in out.out + out.err
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert [c["rate"] for c in doc["cells"]] == [2, 4, 8] and doc["failed_targets"] == []
    assert {c["system"] for c in doc["cells"]} == {doc["systems"][0]["label"]} and len(doc["systems"]) == 1
    assert all(c["summary"]["completed"] == 4 and c["summary"]["policy"] is None for c in doc["cells"])
    assert doc["systems"][0]["cost"]["per_hour"] > 0 and "RTX4090" in doc["systems"][0]["cost"]["source"]


def test_a_target_failing_part_way_keeps_the_other_targets_cells(tmp_path, capsys):
    good, good_url = _serve("sse")
    bad, bad_url = _serve("json")
    try:
        code = main(["--target", f"good={good_url}", "--target", f"bad={bad_url}", "--sweep-rate", "4",
                     "--num-requests", "3", "--output-tokens", "3", "--quiet", "--no-plots", "--out", str(tmp_path)])
    finally:
        good.shutdown()
        bad.shutdown()
    assert code == 1
    assert "1 target(s) failed part-way" in capsys.readouterr().err
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert [c["system"] for c in doc["cells"]] == ["good"] and doc["cells"][0]["summary"]["completed"] == 3
    assert len(doc["failed_targets"]) == 1 and "every warm-up request failed" in doc["failed_targets"][0]


def _order_of_posts(interleave: bool, tmp_path) -> list[str]:
    """Which of two foreign servers each chat request reached, consecutive repeats merged."""
    log: list[str] = []
    servers = []
    for name in ("a", "b"):
        handler = type("H", (_Handler,), {"mode": "sse",
                                          "do_POST": lambda self, n=name: (log.append(n), _Handler.do_POST(self))})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append((name, server))
    try:
        args = [f"--target={n}=http://127.0.0.1:{s.server_address[1]}" for n, s in servers]
        assert main([*args, "--sweep-rate", "20,40", "--num-requests", "3", "--output-tokens", "2", "--quiet",
                     "--no-plots", "--out", str(tmp_path), *(["--interleave"] if interleave else [])]) == 0
    finally:
        for _, s in servers:
            s.shutdown()
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert [(c["system"], c["rate"]) for c in doc["cells"]] == [("a", 20), ("a", 40), ("b", 20), ("b", 40)]
    assert doc["workload"]["interleave"] is interleave
    return [n for i, n in enumerate(log) if i == 0 or log[i - 1] != n]


def test_interleave_runs_each_rate_on_every_target_before_the_next(tmp_path):
    assert _order_of_posts(False, tmp_path / "plain") == ["a", "b"]  # target after target
    assert _order_of_posts(True, tmp_path / "interleaved") == ["a", "b", "a", "b"]  # rate after rate


def test_interleaved_a_target_failing_keeps_the_others_cells(tmp_path, capsys):
    good, good_url = _serve("sse")
    bad, bad_url = _serve("json")
    try:
        code = main(["--target", f"bad={bad_url}", "--target", f"good={good_url}", "--sweep-rate", "4,8",
                     "--num-requests", "3", "--output-tokens", "3", "--quiet", "--no-plots", "--interleave",
                     "--out", str(tmp_path)])
    finally:
        good.shutdown()
        bad.shutdown()
    assert code == 1 and "1 target(s) failed part-way" in capsys.readouterr().err
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert [(c["system"], c["rate"]) for c in doc["cells"]] == [("good", 4), ("good", 8)]


@pytest.mark.parametrize("args,needle", [
    (["--goodput", "ttft:fast", "tpot:5"], "not a number of milliseconds"),
    (["--goodput", "ttft:500"], "needs both ttft and tpot"),
    (["--sweep-rate", "1,-2"], "rates must be > 0"),
    (["--request-rate", "trace"], "replays a --dataset"),
    (["--burstiness", "0"], "--burstiness must be a positive number"),
    (["--num-requests", "0"], "--num-requests must be >= 1"),
    (["--request-rate", "inf", "--duration", "5s"], "--duration needs finite rates"),
    (["--preset", "vllm"], "unknown preset"),
    (["--target", "ftp://x"], "give an http(s) URL"),
    (["--target", "sim"], "needs a plan file"),
    (["--plan", "p.yaml"], "--plan is read by --target sim only"),
    (["--gpus", "3xTPU"], "unknown GPU tier"),
    (["--cost-per-hour", "nope=2"], "no system 'nope'"),
    (["--modality", "hologram"], "unknown modality"),
    (["--video-frames", "0"], "--video-frames must be a whole number >= 1"),
    (["--output-tokens", "uniform:9:3"], "LOW <= HIGH"),
])
def test_bad_input_exits_2_with_a_message(args, needle, tmp_path, capsys):
    assert main(["--target", "http://127.0.0.1:9", *args, "--out", str(tmp_path)]
                if not any(a.startswith("--target") for a in args) else [*args, "--out", str(tmp_path)]) == 2
    assert needle in capsys.readouterr().out


def test_a_missing_plan_file_exits_2(tmp_path, capsys):
    pytest.importorskip("coordinator.planner.planfile", reason="the plan-file reader is not in this checkout")
    assert main(["--target", "sim:/nonexistent/plan.yaml", "--out", str(tmp_path)]) == 2
    assert "cannot read plan file" in capsys.readouterr().out


def test_malformed_dataset_line_exits_2(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "ok"}\n{"prompt": "x", "output_tokens": -3}\n')
    r = bench("--target", "http://127.0.0.1:9", "--dataset", str(data), "--out", str(tmp_path))
    assert r.returncode == 2 and f"{data}:2:" in r.stdout and "Traceback" not in r.stdout + r.stderr


def test_tierserve_bench_runs_the_benchmark_in_a_subprocess():
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "bench", "--help"], check=False, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "usage: tierserve bench" in r.stdout and "--goodput" in r.stdout
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "bench", "--preset", "nope"], check=False, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "unknown preset" in r.stdout
    assert "bench" in subprocess.run([sys.executable, "-m", "coordinator.cli", "--help"], check=False, capture_output=True,
                                     text=True, timeout=120).stdout


def test_targets_parse():
    assert parse_target("http://h:8000/v1/").url == "http://h:8000"
    assert parse_target("vllm=http://h:8000").label == "vllm"
    assert parse_target("http://h:8000/x?a=b").kind == "url"
    t = parse_target("a=sim:plans/p.yaml")
    assert (t.label, t.kind, str(t.plan)) == ("a", "sim", "plans/p.yaml")
    assert parse_target("local").kind == "local"
    with pytest.raises(TargetError):
        parse_target("localhost:8000")


def test_local_cluster_holds_what_the_presets_need():
    plain = local_spec(parse_presets(["passthrough-epd,current"]), LocalOptions())
    assert (plain.llm_roles, plain.local_prefill, plain.steal, plain.pin_cores) == (["combined"], False, False, True)
    full = local_spec(parse_presets(["passthrough-epd", "tierserve"]), LocalOptions())
    assert (full.llm_roles, full.local_prefill, full.steal) == (["combined", "decode"], True, True)
    full.validate()
    assert plain.key_prefix != full.key_prefix  # never collides with another cluster's sockets


def test_presets_are_valid_policies_and_say_what_they_miss():
    from coordinator.policies.base import PolicyConfig

    for p in PRESETS.values():
        if p.policy is not None:
            PolicyConfig.model_validate(p.policy)
    workers = [{"role": "encode"}, {"role": "combined", "colocated_with": None}]
    assert len(missing_workers(PRESETS["tierserve"], workers)) == 2
    assert missing_workers(PRESETS["passthrough-epd"], workers) == []
    with pytest.raises(PresetError, match="twice"):
        parse_presets(["easerve,easerve"])


def test_tierserve_preset_sizes_its_batches_to_the_rate_and_slo():
    from benchmarks.bench.presets import policy_for

    p = PRESETS["tierserve"]
    assert policy_for(p, 2.0, 1, 1000.0)["batch"] | {} == {**p.policy["batch"], "max_batch": 2, "max_wait_s": 0.1}
    assert policy_for(p, 7.5, 2, 500.0)["batch"]["max_batch"] == 4  # ceil(7.5 / 2 encode workers)
    assert policy_for(p, float("inf"), 1, None)["batch"]["max_batch"] == 8
    assert policy_for(p, 3.0, 1, None)["batch"]["max_wait_s"] == 1.0  # no SLO: EAServe's A
    assert policy_for(PRESETS["easerve"], 2.0, 1, 1000.0) == PRESETS["easerve"].policy  # EAServe's defaults


def _image_urls(specs) -> list[str]:
    return [p["image_url"]["url"] for s in specs for p in s.content if p.get("type") == "image_url"]


def test_each_rate_sends_requests_of_its_own_and_every_target_the_same():
    """A server with a prefix or encoder cache (vLLM's are on by default) must not answer a cell from the
    images and prompts of an earlier cell: with one request list for every rate, plain vLLM served the later
    cells' repeats from its caches (TTFT p50 15.9 ms at 4 req/s against 26.7 at 1)."""
    from benchmarks.bench.args import build_parser
    from benchmarks.bench.cli import build_plan
    from benchmarks.bench.sweep import offsets_for

    a = build_parser("").parse_args(["--target", "http://127.0.0.1:9", "--target", "http://127.0.0.1:10",
                                     "--sweep-rate", "1,4,inf", "--num-requests", "6", "--seed", "3"])
    plan = build_plan(a)
    cells = {rate: offsets_for(plan, rate)[0] for rate in plan.rates}
    urls = {rate: _image_urls(specs) for rate, specs in cells.items()}
    assert all(len(u) == 6 for u in urls.values())
    assert not set(urls[1.0]) & set(urls[4.0]) and not set(urls[4.0]) & set(urls[float("inf")])
    texts = {rate: [p["text"] for s in specs for p in s.content if p.get("type") == "text"] for rate, specs in cells.items()}
    assert not set(texts[1.0]) & set(texts[4.0])
    again = build_plan(a)  # the same command, the same requests: a rerun (or a second target) compares like with like
    assert _image_urls(offsets_for(again, 4.0)[0]) == urls[4.0]
    assert _image_urls(offsets_for(plan, 1.0)[0]) == _image_urls(plan.specs)  # the first rate keeps the seed's own
