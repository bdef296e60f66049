"""What the coordinator's image check costs: a JPEG decoded in full against at 1/8 scale (`Image.draft`).

`coordinator/media.py:check_image_bytes` decodes every image's pixels so that a truncated file is a 400 at the
coordinator, not a failure on the encoder. For a JPEG it now decodes at 1/8 scale, which still entropy-decodes
every scan. This times both on the bench's synthetic photographs (benchmarks/bench/media.py) at several sizes,
alternating, and checks both refuse the same truncated files (cut at 50, 90 and 99 %, baseline and
progressive):

    taskset -c 1 python -m benchmarks.image_check --out benchmarks/results/image_check.json
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.bench.media import synthetic_image
from benchmarks.bench.report import write_json

SIZES = [(336, 336), (672, 672), (1024, 768), (2048, 1536)]


def full(raw: bytes) -> None:
    with Image.open(io.BytesIO(raw)) as im:
        im.load()


def scaled(raw: bytes) -> None:
    with Image.open(io.BytesIO(raw)) as im:
        w, h = im.size
        im.draft(im.mode, ((w + 7) // 8, (h + 7) // 8))
        im.load()


def _median_ms(fn, images: list[bytes], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        for raw in images:
            t0 = time.perf_counter()
            fn(raw)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _refused(fn, raw: bytes) -> bool:
    try:
        fn(raw)
    except OSError:
        return True
    return False


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=8, help="distinct images per size (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="passes over them per median (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the JSON here")
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for w, h in SIZES:
        images = [synthetic_image(rng, w, h) for _ in range(a.images)]
        full_ms, scaled_ms = [], []
        for _ in range(3):  # alternated, so a drift of the host's speed hits both
            full_ms.append(_median_ms(full, images, a.repeats))
            scaled_ms.append(_median_ms(scaled, images, a.repeats))
        row = {"size": f"{w}x{h}", "jpeg_bytes": int(statistics.median(len(i) for i in images)),
               "full_decode_ms": statistics.median(full_ms), "scaled_decode_ms": statistics.median(scaled_ms)}
        row["ratio_scaled_over_full"] = row["scaled_decode_ms"] / row["full_decode_ms"]
        rows.append(row)
        print(f"{row['size']:>9s}: full {row['full_decode_ms']:7.3f} ms, 1/8 scale {row['scaled_decode_ms']:7.3f} ms "
              f"(x{row['ratio_scaled_over_full']:.2f})")
    cases, agree = 0, 0
    for raw in [synthetic_image(rng, w, h) for w, h in SIZES]:
        buf = io.BytesIO()
        with Image.open(io.BytesIO(raw)) as im:
            im.save(buf, "JPEG", progressive=True)
        for variant in (raw, buf.getvalue()):
            for cut in (0.5, 0.9, 0.99):
                cut_raw = variant[: int(len(variant) * cut)]
                cases += 1
                agree += _refused(full, cut_raw) == _refused(scaled, cut_raw) == True  # noqa: E712
    print(f"truncated files refused by both: {agree} of {cases}")
    doc = {"tool": "benchmarks.image_check",
           "command": "python -m benchmarks.image_check " + " ".join(sys.argv[1:] if argv is None else argv),
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows,
           "truncated_refused_by_both": agree, "truncated_cases": cases}
    if a.out:
        write_json(a.out, doc)
        print(f"wrote {a.out}")
    if agree != cases:
        raise SystemExit("a truncated file one decode refuses and the other does not: see tests/coordinator/test_media.py")


if __name__ == "__main__":
    main()
