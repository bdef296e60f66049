"""--device and --dtype: flags, placement by the launcher, and the model in that dtype end to end on the CPU.

Tolerance for bfloat16 (benchmarks/gpu/exactness.py states it, and the GPU pack checks the same): against the
float32 model's generate(), every step whose tokens still agree has logits within BF16_ATOL = 0.5 (absolute;
the tiny model's logits span about +-6), and the greedy tokens agree up to the first step where float32's
own top-2 margin is below 2 * BF16_ATOL (there a bf16 rounding may legitimately pick the runner-up; past it
the sequences differ). Against the
same weights in bfloat16 run by generate(), the disaggregated path must give the same tokens and logits
within BF16_SELF_ATOL (measured: 0.0 on this CPU).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from benchmarks.gpu.exactness import CASES, bf16_problems, case_inputs, generate_ref
from coordinator.launcher import ClusterError, ClusterSpec
from coordinator.protocol.models import DEFAULT_MODEL_DIR
from coordinator.protocol.worker_config import require_device
from llm_node.config import LLMWorkerConfig

BF16_SELF_ATOL = 1e-2


def test_flags_reach_both_kinds_of_worker():
    from encode_node.__main__ import parse as parse_encode
    from llm_node.__main__ import parse as parse_llm

    cfg = parse_llm(["--worker-id", "l0", "--device", "cuda", "--dtype", "bfloat16"])
    assert (cfg.device, cfg.dtype, cfg.torch_dtype()) == ("cuda:0", "bfloat16", torch.bfloat16)
    enc = parse_encode(["--worker-id", "e0", "--device", "cuda:3", "--dtype", "float16"])
    assert (enc.device, enc.dtype) == ("cuda:3", "float16")
    default = parse_llm(["--worker-id", "l0"])
    assert (default.device, default.dtype) == ("cpu", "float32")  # the embedded default is unchanged


@pytest.mark.parametrize("argv", [["--device", "gpu0"], ["--device", "cuda:x"], ["--dtype", "int8"]])
def test_bad_flags_are_usage_errors(argv, capsys):
    from llm_node.__main__ import parse as parse_llm

    with pytest.raises(SystemExit) as e:
        parse_llm(["--worker-id", "l0", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "cpu or cuda:N" in err or "invalid choice: 'int8'" in err


def test_a_missing_gpu_is_a_message():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    require_device("cpu")
    with pytest.raises(SystemExit, match=r"--device cuda:0: torch .* sees no CUDA device here.*use --device cpu"):
        require_device("cuda:0")


def test_launcher_places_each_slot():
    assert ClusterSpec().placement(0) == ["--device", "cpu", "--dtype", "float32"]
    assert ClusterSpec(device="cuda:1", dtype="bfloat16").placement(5) == ["--device", "cuda:1", "--dtype", "bfloat16"]
    assert ClusterSpec(device="cuda").placement(2)[:2] == ["--device", "cuda:2"]
    assert ClusterSpec(device="cuda", gpu_indices=[4, 0, 7]).placement(2)[:2] == ["--device", "cuda:7"]
    for bad in ({"device": "gpu"}, {"dtype": "int8"}):
        with pytest.raises(ClusterError, match="use cpu, cuda"):
            ClusterSpec(**bad).validate()


def test_a_plan_gives_each_gpu_its_index():
    from plan_file_factory import small_plan

    from coordinator.plan_launch import planned_cluster

    plan = small_plan()
    layout = planned_cluster(plan)
    encoders = sorted((n for n in plan.nodes if n.role in ("E", "E+P")), key=lambda n: n.role != "E+P")
    llms = [n for n in plan.nodes if n.role in ("P", "D", "P+D")]
    assert layout.gpu_indices == [n.gpu_index for n in [*encoders, *llms]]
    assert len(layout.gpu_indices) == layout.encode_workers + len(layout.llm_roles)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_and_encoder_in_a_dtype(dtype, tiny):
    """The worker's own loading (build_engine, make_encoder) in `dtype`: float32 exact, bfloat16 within tolerance."""
    from encode_node.registry import make_encoder
    from llm_node.engine import EngineRequest
    from llm_node.engines import build_engine
    from logit_check import logit_mismatches

    from coordinator.protocol.messages import SamplingParams

    model32, processor = tiny
    cfg = LLMWorkerConfig(worker_id="l0", dtype=dtype)
    built = build_engine(cfg)
    encoder = make_encoder(DEFAULT_MODEL_DIR, "cpu", dtype)
    assert next(built.model.parameters()).dtype == cfg.torch_dtype() == next(encoder.model.parameters()).dtype
    problems = []
    for seed, sizes, text, n in CASES:
        pngs, inputs = case_inputs(processor, seed, sizes, text)
        mm = encoder.encode([pngs]).per_request[0] if pngs else None
        assert mm is None or mm.dtype == cfg.torch_dtype()  # features leave in the model's dtype
        engine = built.engine
        engine.add(EngineRequest(f"r{seed}", inputs["input_ids"][0].tolist(),
                                 SamplingParams(max_tokens=n, ignore_eos=True, return_logits=True), mm_embeddings=mm))
        tokens, logits = [], []
        for _ in range(4 * n):
            for out in engine.step():
                assert out.finish_reason != "error", out
                tokens += out.new_token_ids
                logits += out.logits
            if not engine.has_unfinished():
                break
        ref32 = generate_ref(model32, inputs, n, "cpu", torch.float32)
        if dtype == "float32":
            problems += logit_mismatches(text, *ref32, tokens, logits)
        else:
            problems += bf16_problems(text, *ref32, tokens, logits)
            problems += logit_mismatches(f"{text} (bf16 vs bf16 generate)", *generate_ref(built.model, inputs, n, "cpu", torch.bfloat16),
                                         tokens, logits, atol=BF16_SELF_ATOL)
    assert not problems, "\n".join(problems)


@pytest.mark.redis
@pytest.mark.slow
def test_bfloat16_cluster_end_to_end(redis_url, tmp_path, tiny):
    """`--dtype bfloat16` through the launcher: encode worker -> transport -> prefill worker -> KV hand-off ->
    decode worker, all in bf16 on the CPU; tokens within the stated tolerance of float32's generate()."""
    import httpx
    from cluster_factory import serve_cluster
    from redis.asyncio import Redis

    from coordinator.protocol.keys import Keys
    from coordinator.protocol.messages import EncodeJob, MediaRef, SamplingParams
    from coordinator.protocol.streams import push_job
    from protocol_runs import collect

    model32, processor = tiny
    seed, sizes, text, n = CASES[0]
    pngs, inputs = case_inputs(processor, seed, sizes, text)
    gen = serve_cluster(tmp_path, encode_workers=1, llm_roles=["prefill", "decode"], dtype="bfloat16",
                        redis_url=redis_url)
    cluster = next(gen)
    try:
        workers = httpx.get(f"{cluster.url}/v1/cluster", timeout=10).json()["workers"]
        assert {w["device"] for w in workers} == {"cpu bfloat16"}
        assert all(w["gpu_telemetry"].startswith("unsupported: ") for w in workers)

        async def run() -> tuple[list[int], list[torch.Tensor]]:
            redis, keys = Redis.from_url(cluster.redis_url), Keys(cluster.spec.key_prefix)
            try:
                rid = f"bf16-{time.monotonic_ns()}"
                await redis.set(keys.media(rid, 0), pngs[0], ex=120)
                await push_job(redis, keys, "encode-0", EncodeJob(
                    request_id=rid, prompt_token_ids=inputs["input_ids"][0].tolist(), arrival=time.time(),
                    sampling=SamplingParams(max_tokens=n, ignore_eos=True, return_logits=True),
                    media=[MediaRef(key=keys.media(rid, 0))], prefill_worker="llm-0-prefill"))
                tokens, logits, _ = await collect(redis, keys, rid, timeout_s=60)
                return tokens, logits
            finally:
                await redis.aclose()

        tokens, logits = asyncio.run(run())
    finally:
        gen.close()
    assert len(tokens) == n
    problems = bf16_problems(text, *generate_ref(model32, inputs, n, "cpu", torch.float32), tokens, logits)
    assert not problems, "\n".join(problems)
