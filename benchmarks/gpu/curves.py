"""Pack steps b and d: the encoder's batch-size curve C_E(B) and the 7B language model's prefill/decode times.

Timed with CUDA events around the forward only (inputs already on the GPU), after warm-up, median of
`iters`; each returns the planner's Profile points (coordinator/planner/profile.py) beside the rates.
Step d runs the reference engine's own forwards (ModelRunner.prefill / ModelRunner.decode, which
build the padded batch cache every step as the engine does) on a LLaVA-1.5-7B-sized model.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from benchmarks.gpu import pack_models as pm


def cuda_ms(fn: Callable[[], Any], iters: int, warmup: int) -> float:
    """Median milliseconds of `fn` on the current stream, timed with CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def encoder_curve(kind: str, device: str, batches: list[int], iters: int, deadline: Callable[[], bool]) -> dict:
    """C_E(B) of `kind` ("llava-1.5-7b" CLIP-L/336 + projector, or "qwen2-vl-7b" vision tower) in bf16."""
    import torch

    if kind == "llava-1.5-7b":
        from encode_node.vision_layers import drop_unread_layers

        model = pm.llava_model(device, torch.bfloat16, text_layers=1).model
        drop_unread_layers(model)  # as the encode worker runs it: 23 of CLIP-L's 24 layers (feature layer -2)
        tokens = pm.LLAVA_IMAGE_TOKENS

        def forward(b: int):
            pixels = torch.randn(b, 3, 336, 336, device=device, dtype=torch.bfloat16)
            return lambda: model.get_image_features(pixel_values=pixels)
    else:
        model = pm.qwen2vl_visual(device, torch.bfloat16)
        tokens = (pm.QWEN2VL_IMAGE_SIDE // 28) ** 2

        def forward(b: int):
            pixels, grid = pm.qwen2vl_inputs(b, device, torch.bfloat16)
            return lambda: model(pixels, grid_thw=grid)
    points = []
    with torch.inference_mode():
        for b in batches:
            if deadline():
                break
            ms = cuda_ms(forward(b), iters, warmup=2)
            points.append({"batch": b, "seconds": ms / 1e3, "items_per_s": b / (ms / 1e3)})
    del model
    torch.cuda.empty_cache()
    per_item_1 = points[0]["seconds"] if points else None
    gain8 = next((per_item_1 * 8 / p["seconds"] for p in points if p["batch"] == 8), None) if per_item_1 else None
    return {"model": kind, "tokens_per_item": tokens, "points": points, "batching_gain_at_8": gain8,
            "best_items_per_s": max((p["items_per_s"] for p in points), default=None)}


def llm_times(device: str, prompt_lengths: list[int], decode_batches: list[int], context: int, iters: int,
              deadline: Callable[[], bool], text_layers: int = 32) -> dict:
    """Prefill seconds per prompt length (batch 1) and decode-step seconds per batch at `context` tokens each."""
    import torch

    from llm_node.model_runner import ModelRunner

    model = pm.llava_model(device, torch.bfloat16, text_layers=text_layers)
    model.model.vision_tower = None  # the LLM node never runs it
    runner = ModelRunner(model)
    vocab = 32000  # below the image token
    prefill, decode = [], []
    with torch.inference_mode():
        for n in prompt_lengths:
            if deadline():
                break
            ids = torch.randint(0, vocab, (n,)).tolist()
            ms = cuda_ms(lambda: runner.prefill([ids], [None]), iters, warmup=1)
            prefill.append({"tokens": n, "seconds": ms / 1e3, "tokens_per_s": n / (ms / 1e3)})
        for b in decode_batches:
            if deadline():
                break
            prompts = [torch.randint(0, vocab, (context,)).tolist() for _ in range(b)]
            kvs = [kv for i in range(0, b, 8) for kv in runner.prefill(prompts[i:i + 8], [None] * len(prompts[i:i + 8])).kvs]
            fed = [1] * b
            ms = cuda_ms(lambda: runner.decode(fed, kvs), iters, warmup=2)  # decode leaves the caches untouched
            decode.append({"batch": b, "context_tokens": b * context, "seconds": ms / 1e3,
                           "tokens_per_s": b / (ms / 1e3)})
            del kvs
    del model, runner
    torch.cuda.empty_cache()
    return {"model": "llava-1.5-7b", "text_layers": text_layers, "dtype": "bfloat16", "prefill": prefill,
            "decode": decode, "context_per_sequence": context}


def planner_profile(tier: str, when: str, source: str, llava_curve: dict | None, llm: dict | None) -> dict:
    """A `tierserve plan --profile` file (coordinator/planner/profile.py's Profile) from what was measured."""
    out: dict[str, Any] = {"tier": tier, "model": "llava-1.5-7b", "measured_at": when, "source": source}
    if llava_curve and llava_curve["points"]:
        out["encode"] = {"image": {"tokens_per_item": llava_curve["tokens_per_item"],
                                   "points": [{"batch": p["batch"], "seconds": p["seconds"]}
                                              for p in llava_curve["points"]]}}
    if llm:
        out["prefill"] = [{"tokens": p["tokens"], "seconds": p["seconds"]} for p in llm["prefill"]]
        out["decode"] = [{k: p[k] for k in ("batch", "context_tokens", "seconds")} for p in llm["decode"]]
    return out
