"""Per (sigma, period ms): the low-rate spread distance (mean |log sim/live| over TTFT and TPOT p10/p50/p75/p90 at
each layout's lowest rate, averaged over the layouts) and the cells within 10 %, from what sweep.sh wrote."""
import json, math, glob, collections
res = collections.defaultdict(dict)
for f in glob.glob("/tmp/noise-trial/sw-*.json"):
    name = f.split("sw-")[1][:-5]
    lay, s, T = name.rsplit("-", 2)
    d = json.load(open(f))["layouts"][0]
    cells = sorted(d["cells"], key=lambda c: c["rate"])
    low = cells[0]
    dist = []
    for m in ("ttft", "tpot"):
        for lv, sv in zip(low["live_spread"][m], low["sim"]["spread"][m]):
            dist.append(abs(math.log(sv / lv)))
    within = sum(abs(e) <= 0.10 for c in cells for e in c["error"].values() if e is not None)
    res[(float(s), float(T))][lay] = (sum(dist) / len(dist), within)
for k in sorted(res):
    v = res[k]
    if len(v) < 4: continue
    print(k, "low-rate spread dist %.3f" % (sum(x[0] for x in v.values()) / 4), "within", sum(x[1] for x in v.values()), {l: x[1] for l, x in v.items()})
