"""The layouts' SLO rule: the middle rate's p75 TTFT and TPOT (both live runs pooled), rounded up to 5 ms / 0.5 ms."""
import json, math, sys
import numpy as np
r = json.load(open(sys.argv[1]))
out = []
for rep in r["layouts"]:
    cells = sorted(rep["cells"], key=lambda c: c["rate"])
    mid = cells[len(cells) // 2]
    tt, tp = [], []
    for run in mid["live_runs"]:
        rec = run["records"]
        for t, e, n, err in zip(rec["ttft"], rec["e2e"], rec["output_tokens"], rec["error"]):
            if err is None and t is not None:
                tt.append(t)
                if n and n > 1:
                    tp.append((e - t) / (n - 1))
    a = math.ceil(np.percentile(tt, 75) * 1000 / 5) * 5
    b = math.ceil(np.percentile(tp, 75) * 1000 / 0.5) * 0.5
    out.append(f"{rep['layout']}={a:g}ms,{b:g}ms")
print(" ".join(out))
