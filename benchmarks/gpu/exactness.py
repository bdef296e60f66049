"""Pack step a: the tiny LLaVA through encode -> transport -> prefill -> KV transport -> decode on one device.

Workers' own parts, in one process (no Redis there): the encoder as the encode worker loads it
(make_encoder), the `local` transport's real sockets for the embeddings and the KV cache, a prefill
engine and a decode engine as build_engine loads them. Compared with the same weights' generate() on
the same device: float32 exact (tokens equal, logits within FP32_ATOL, TF32 off), bfloat16 within the
tolerance `bf16_problems` states (tests/llm_node/test_device_dtype.py checks the same on the CPU).
"""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

BF16_ATOL = 0.5
"""bf16 vs float32 generate(): logits within this (absolute; the tiny model's span about +-6) while tokens agree."""
FP32_ATOL = 1e-3
CASES = [(1, [(300, 200)], "describe the image", 10), (2, [], "what is this", 8),
         (3, [(224, 400), (512, 256)], "tell me about the two pictures please", 10)]
"""(seed, image sizes, text, tokens)."""


def bf16_problems(name: str, ref_tokens: list[int], ref_logits: list, tokens: list[int], logits: list) -> list[str]:
    """How a bf16 run breaks the tolerance against float32's generate(): every step whose tokens still agree
    has logits within BF16_ATOL, and tokens agree up to the first step where float32's own top-2 margin is
    below 2 * BF16_ATOL (a bf16 rounding may pick the runner-up there; past it the sequences differ)."""
    problems = []
    if len(tokens) != len(ref_tokens):
        problems.append(f"{name}: {len(tokens)} tokens, reference {len(ref_tokens)}")
    for i, (want, got, ref, lg) in enumerate(zip(ref_tokens, tokens, ref_logits, logits)):
        diff = (lg.float().cpu() - ref.float().cpu()).abs().max().item()
        if diff > BF16_ATOL:
            problems.append(f"{name}: step {i} logits differ by {diff:.3f} > {BF16_ATOL}")
        if want != got:
            top2 = ref.float().topk(2).values
            margin = (top2[0] - top2[1]).item()
            if margin >= 2 * BF16_ATOL:
                problems.append(f"{name}: step {i} token {got} != {want} where float32's margin is {margin:.3f}")
            break
    return problems


def case_inputs(processor, seed: int, sizes: list[tuple[int, int]], text: str):
    """(PNG bytes of seeded random images, the processor's inputs for the chat-templated prompt)."""
    import numpy as np
    from PIL import Image

    pngs, images = [], []
    for i, (h, w) in enumerate(sizes):
        im = Image.fromarray(np.random.default_rng(seed + i).integers(0, 256, (h, w, 3), dtype=np.uint8))
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        pngs.append(buf.getvalue())
        images.append(im)
    content = [{"type": "image"}] * len(images) + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return pngs, processor(text=prompt, images=images or None, return_tensors="pt")


def generate_ref(model, inputs, n: int, device: str, dtype) -> tuple[list[int], list]:
    """The model's own greedy generate(): (tokens, each step's float32 logits on the CPU)."""
    import torch

    inputs = {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) for k, v in inputs.items()}
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=n, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=None)
    k = inputs["input_ids"].shape[1]
    return out.sequences[0, k:].tolist(), [s[0].float().cpu() for s in out.logits]


def _drain(engine, limit: int) -> list:
    outs = []
    for _ in range(limit):
        outs += engine.step()
        if not engine.has_unfinished():
            break
    return outs


async def _disaggregated(encoder, prefill, decode, inputs, pngs, n: int, rid: str) -> tuple[list[int], list, dict]:
    """One request along the workers' path; returns tokens, logits and where the time went."""
    from coordinator.protocol.messages import SamplingParams
    from llm_node.engine_api import EngineRequest
    from transport.registry import make_receiver, make_sender

    sampling = SamplingParams(max_tokens=n, ignore_eos=True, return_logits=True)
    prompt = inputs["input_ids"][0].tolist()
    rx_p, rx_d = make_receiver("local", f"pack-p-{rid}"), make_receiver("local", f"pack-d-{rid}")
    sender = make_sender("local")
    await rx_p.start()
    await rx_d.start()
    try:
        t0 = time.perf_counter()
        mm = encoder.encode([pngs]).per_request[0] if pngs else None
        t1 = time.perf_counter()
        tensors = {}
        if mm is not None:
            tensors = await rx_p.recv(await sender.send(rx_p.address, rid, {"mm_embeds": mm}))
        prefill.add(EngineRequest(rid, prompt, sampling, mm_embeddings=tensors.get("mm_embeds")))
        first = _drain(prefill, 4)
        handed = [o for o in first if o.handoff_kv is not None]
        tokens = [t for o in first for t in o.new_token_ids]
        logits = [lg for o in first for lg in o.logits]
        if handed:
            kv = (await rx_d.recv(await sender.send(rx_d.address, rid, {"kv": handed[0].handoff_kv})))["kv"]
            decode.add(EngineRequest(rid, prompt, sampling, kv=kv, output_token_ids=list(handed[0].handoff_output_ids)))
            rest = _drain(decode, 4 * n)
            tokens += [t for o in rest for t in o.new_token_ids]
            logits += [lg for o in rest for lg in o.logits]
        return tokens, logits, {"encode_s": t1 - t0, "total_s": time.perf_counter() - t0,
                                "embedding_dtype": None if mm is None else str(mm.dtype).removeprefix("torch.")}
    finally:
        await sender.close()
        await rx_p.close()
        await rx_d.close()


def run(device: str, dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> dict[str, Any]:
    """Every case in every dtype; {"ok": all held, per dtype: cases with tokens, problems, timings}."""
    import torch
    from transformers import AutoProcessor

    from coordinator.protocol.models import DEFAULT_MODEL_DIR
    from encode_node.registry import make_encoder
    from llm_node.architectures import load_model
    from llm_node.config import LLMWorkerConfig
    from llm_node.engines import build_engine

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    processor = AutoProcessor.from_pretrained(DEFAULT_MODEL_DIR)
    ref_model = load_model(DEFAULT_MODEL_DIR, torch.float32).to(device)
    out: dict[str, Any] = {"device": device, "model": str(DEFAULT_MODEL_DIR.name), "fp32_atol": FP32_ATOL,
                           "bf16_atol": BF16_ATOL, "ok": True}
    for dtype in dtypes:
        encoder = make_encoder(DEFAULT_MODEL_DIR, device, dtype)
        prefill = build_engine(LLMWorkerConfig(worker_id="p", role="prefill", device=device, dtype=dtype)).engine
        decode = build_engine(LLMWorkerConfig(worker_id="d", role="decode", device=device, dtype=dtype)).engine
        rows = []
        for seed, sizes, text, n in CASES:
            pngs, inputs = case_inputs(processor, seed, sizes, text)
            ref_tokens, ref_logits = generate_ref(ref_model, inputs, n, device, torch.float32)
            tokens, logits, timing = asyncio.run(
                _disaggregated(encoder, prefill, decode, inputs, pngs, n, f"{dtype}-{seed}"))
            if dtype == "float32":
                problems = [f"{text}: tokens {tokens} != {ref_tokens}"] if tokens != ref_tokens else []
                diffs = [(a - b).abs().max().item() for a, b in zip(logits, ref_logits)]
                problems += [f"{text}: logits differ by {max(diffs):.2e}"] if diffs and max(diffs) > FP32_ATOL else []
            else:
                problems = bf16_problems(text, ref_tokens, ref_logits, tokens, logits)
            agree = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), len(ref_tokens))
            rows.append({"case": text, "tokens": tokens, "reference_tokens": ref_tokens, "agreeing_prefix": agree,
                         "problems": problems, **timing})
            out["ok"] = out["ok"] and not problems
        out[dtype] = rows
    return out
