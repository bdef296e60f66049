"""What the LLaVA encoder's lean path saves: `LlavaImageEncoder.encode` with and without it, side by side.

The lean path (the default) drops the vision layers no feature reads (encode_node/vision_layers.py), makes the
pixel values with the image processor's own methods but not its per-call overhead (encode_node/image_pixels.py)
and runs the tower as plain tensor operations (encode_node/lean_clip.py); `lean=False` is transformers' processor
and whole tower. Both encoders are loaded in one process and timed
alternately on the bench's synthetic photographs (benchmarks/bench/media.py), one image per call as at light load
and a micro-batch of 8, with the outputs checked equal to the bit. Per call it also splits the time into pixel
values and the tower + projector. Run pinned, one torch thread, as an encode worker runs:

    taskset -c 1 python -m benchmarks.encoder_forward --out benchmarks/results/encoder_forward.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench.media import synthetic_image
from benchmarks.bench.report import write_json
from coordinator.protocol.models import DEFAULT_MODEL_DIR
from encode_node.encoded import decode_image
from encode_node.encoder import LlavaImageEncoder


@torch.inference_mode()
def _split_ms(enc: LlavaImageEncoder, raws: list[bytes]) -> tuple[float, float, float]:
    """(decode, pixel values, tower + projector) ms for one call on `raws`."""
    t0 = time.perf_counter()
    images = [decode_image(r) for r in raws]
    t1 = time.perf_counter()
    px = enc.pixel_values(images)
    t2 = time.perf_counter()
    enc.tower(px)
    t3 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3


def _encode_ms(enc: LlavaImageEncoder, raws: list[bytes]) -> float:
    t0 = time.perf_counter()
    enc.encode([[r] for r in raws])
    return (time.perf_counter() - t0) * 1e3


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="LLaVA checkpoint dir (default: the tiny LLaVA)")
    p.add_argument("--images", type=int, default=16, help="distinct 336 px images (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5, help="alternations of the two encoders (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the JSON here")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    raws = [synthetic_image(rng, 336, 336) for _ in range(a.images)]
    encoders = {"reference": LlavaImageEncoder(a.model, lean=False), "lean": LlavaImageEncoder(a.model)}
    lean = encoders["lean"]
    same = all(torch.equal(x, y) for x, y in zip(lean.encode([[r] for r in raws]).per_request,
                                                   encoders["reference"].encode([[r] for r in raws]).per_request))
    batches = {"1 image": [[r] for r in raws], "8 images": [raws[i:i + 8] for i in range(0, len(raws), 8)]}
    times: dict[str, dict[str, list[float]]] = {k: {b: [] for b in batches} for k in encoders}
    parts: dict[str, list[tuple[float, float, float]]] = {k: [] for k in encoders}
    for name, enc in encoders.items():  # warm-up
        for calls in batches.values():
            for raw in calls:
                _encode_ms(enc, raw)
    for _ in range(a.rounds):  # alternated, so a drift of the host's speed hits both
        for name, enc in encoders.items():
            for b, calls in batches.items():
                times[name][b].extend(_encode_ms(enc, raw) for raw in calls)
            parts[name].extend(_split_ms(enc, [r]) for r in raws)
    rows = []
    for b in batches:
        ref, new = (statistics.median(times[k][b]) for k in ("reference", "lean"))
        rows.append({"batch": b, "reference_ms": ref, "lean_ms": new, "ratio_lean_over_reference": new / ref})
        print(f"{b:>8s} per call: reference {ref:6.3f} ms, lean {new:6.3f} ms (x{new / ref:.2f})")
    split = {k: dict(zip(("decode_ms", "pixels_ms", "tower_ms"),
                         (statistics.median(x[i] for x in parts[k]) for i in range(3)))) for k in encoders}
    for k, s in split.items():
        print(f"{k:>9s}, one image: decode {s['decode_ms']:.3f}, pixel values {s['pixels_ms']:.3f}, "
              f"tower + projector {s['tower_ms']:.3f} ms")
    print(f"outputs equal to the bit: {same}; vision layers dropped: {lean.dropped_layers}; "
          f"lean pixel values: {'yes' if lean.pixels is not None else 'no, ' + str(lean.pixels_why)}; "
          f"lean tower: {'yes' if lean.features is not None else 'no, ' + str(lean.features_why)}")
    if a.out:
        write_json(a.out, {"command": " ".join(["python -m benchmarks.encoder_forward", *sys.argv[1:]]),
                           "model": str(a.model), "images": a.images, "rounds": a.rounds, "threads": 1,
                           "outputs_equal": same, "dropped_layers": lean.dropped_layers,
                           "lean_pixels": lean.pixels is not None, "lean_tower": lean.features is not None, "rows": rows,
                           "split_one_image": split})
    if not same:
        sys.exit("the lean path's features differ from the reference's")


if __name__ == "__main__":
    main()
