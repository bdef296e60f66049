"""python benchmarks/results/sim_fidelity_s27/prefill_split.py JUDGED.json...: per layout and run, the simulated over
the live compute of the prefill steps and of the decode steps, at the run's speed as the file was judged (one LLM
factor before session 27: P and D apart show what it missed; two factors: both near 1)."""
import json
import sys
from pathlib import Path

for f in sys.argv[1:]:
    d = json.loads(Path(f).read_text())
    print(Path(f).stem, d.get("date"))
    for rep in d["layouts"]:
        row = []
        for cell in rep["cells"]:
            for run in cell["sim_run_speed"]["runs"]:
                sim, live = run["compute_s"], run["live_compute_s"]
                if "prefill" in live:
                    row.append(f"P{sim['prefill'] / live['prefill']:.2f} D{sim['decode'] / live['decode']:.2f}")
        print(f"  {rep['layout']:<18} " + " ".join(row))
