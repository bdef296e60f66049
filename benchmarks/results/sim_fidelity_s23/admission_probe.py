"""Admission phase alone (profiling_admission.py) on a profiling cluster, or on a layout's own cluster: python benchmarks/results/sim_fidelity_s23/admission_probe.py REPEATS [profile|epd|...]"""
import asyncio, sys, json, httpx
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port
from coordinator.planner.live_http import PromptSizer, served_model, put_policy, ask, chat_body
from coordinator.planner.profiling_phases import ProfileSettings
from coordinator.planner.profiling_admission import admission_phase, admit_s
import benchmarks.sim_fidelity_layouts as L
from benchmarks.sim_fidelity_live import pin, put_policy as put_layout

async def probe(url, s):
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        model = await served_model(c)
        for _ in range(3):
            await ask(c, chat_body(model, 8, 1, 4))
        sizer = await PromptSizer.calibrate(c, model)
        out = await admission_phase(c, model, sizer, s, lambda n: None)
    return out

s = ProfileSettings(repeats=int(sys.argv[1]), retries=6)
which = sys.argv[2] if len(sys.argv) > 2 else "profile"
if which == "profile":
    spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], port=free_port(), pin_cores=True, key_prefix="tsadm")
    with LocalCluster(spec) as cl:
        out = asyncio.run(probe(cl.url, s))
else:
    layout = L.LAYOUTS[which]
    with LocalCluster(layout.spec()) as cl:
        pin(cl, layout.pins); put_layout(cl.url, layout)
        out = asyncio.run(probe(cl.url, s))
for x in out:
    print(f"joins {x.joins} alone {x.gap_alone_s*1e3:.2f} ms joined {x.gap_joined_s*1e3:.2f} ms -> {x.admit_s*1e3:.2f} ms/join")
print(which, "admit_s median", round(admit_s(out)*1e3, 3), "ms of", len(out))
