"""Trial (session 22): after `profile_cluster` returns, does the profiling cluster still use CPU (on the cores the
live layout's workers are pinned to) while the live runs that follow are measured?

    python benchmarks/results/sim_fidelity_trials22/profile_afterglow.py OUT.json
"""
import asyncio
import json
import sys
import time

from benchmarks.sim_fidelity_host import process_cpu_s
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.planner.profiling import ProfileSettings, profile_cluster
from coordinator.redis_server import free_port

spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], port=free_port(), pin_cores=True, key_prefix="tsfid-profile")
rows = []
with LocalCluster(spec) as prof:
    pids = {n: p.pid for n, p in prof.procs.items()}
    t0 = time.monotonic()
    asyncio.run(profile_cluster(prof.url, ProfileSettings(repeats=2), source="afterglow trial",
                                stack_pids=[prof.procs["coordinator"].pid]))
    print(f"profile took {time.monotonic() - t0:.1f} s", flush=True)
    for k in range(12):
        before = {n: process_cpu_s(p) for n, p in pids.items()}
        time.sleep(5)
        used = {n: round((process_cpu_s(p) - before[n]) / 5, 3) for n, p in pids.items()}
        rows.append({"after_s": 5 * (k + 1), "cores": used})
        print(rows[-1], flush=True)
json.dump({"command": " ".join(sys.argv), "rows": rows}, open(sys.argv[1], "w"), indent=1)
