"""python benchmarks/results/sim_fidelity_s26/judged_stack_share_097/rejudge.py STACK_SHARE OUT_DIR records.json...: re-judge saved
records with sim_fidelity_layouts.COMPUTE_STACK_STRETCHED set (none: off), printing the cells within 10 % per reading."""
import sys, json, contextlib, io
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import benchmarks.sim_fidelity_layouts as L
from benchmarks import sim_fidelity
share = sys.argv[1]
L.COMPUTE_STACK_STRETCHED = None if share == 'none' else float(share)
out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
for f in sys.argv[3:]:
    dest = out / (Path(f).stem + '.json')
    with contextlib.redirect_stdout(io.StringIO()):
        sim_fidelity.main(['--resimulate', f, '--out', str(dest)])
    d = json.load(open(dest))
    tally = {}
    for key in ('within_10pct', 'within_10pct_run_speed', 'within_10pct_run_trace'):
        tally[key] = sum(c.get(key, False) for rep in d['layouts'] for c in rep['cells'])
    print(share, Path(f).stem, tally, flush=True)
